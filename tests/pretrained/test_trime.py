"""TRIME training continued from an imported GPT-2, through memjax.main."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

import memjax
from memjax import dispatch
from tests.conftest import run_main


def _losses(workdir):
  with open(os.path.join(workdir, "train_log.jsonl"), encoding="utf-8") as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f)}


def test_trime_from_an_import_trains_resumes_and_evaluates(
    imported_gpt2, tmp_path
):
  whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
  flags = (
      "--config=configs/pretrained.py:gpt2_trime",
      f"--config.train.init_from={imported_gpt2}",
      "--config.train.num_steps=2",
      "--config.train.checkpoint_every=1",
      "--config.train.log_every=1",
      "--config.train.eval_every=0",
      "--config.optim.warmup_steps=1",
      "--config.eval.max_windows=2",
      "--config.eval.splits=('valid',)",
  )
  proc = run_main(*flags, f"--workdir={whole}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "initialised 36 parameter arrays from" in proc.stdout + proc.stderr
  # The run reads raw text through the import's tokenizer, and saves it.
  with open(os.path.join(whole, "config.json"), encoding="utf-8") as f:
    saved = json.load(f)
  assert saved["data"]["tokenizer"] == imported_gpt2
  assert saved["model"]["max_len"] == 32 and saved["data"]["seq_len"] == 32
  assert saved["trime"]["memory"] == "long" and saved["model"]["dropout"] == 0.1
  with open(os.path.join(whole, "vocab.json"), encoding="utf-8") as f:
    assert json.load(f)["kind"] == "tokenizer"
  # Stopped after step 1 and resumed: step 2 is the same, bit for bit.
  shutil.copytree(whole, parts)
  shutil.rmtree(os.path.join(parts, "checkpoints", "2"))
  proc = run_main(*flags, f"--workdir={parts}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resumed from" in proc.stdout + proc.stderr
  assert _losses(parts)[2] == _losses(whole)[2]
  a, b = memjax.load(whole).restored, memjax.load(parts).restored
  assert a.step == b.step == 2
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # The evaluation memories: M_local u M_long.
  res = memjax.run_mode("memeval", None, whole)
  assert res["kind"] == "trime" and res["valid"]["memory"]["tokens"] > 0
  assert np.isfinite(res["valid"]["memory"]["nll"])


def test_bfloat16_weights_train_build_a_datastore_and_export(
    imported_gpt2, tmp_path
):
  """model.param_dtype=bfloat16 from an import: the run trains with float32
  Adam state, its datastore is built, and a bfloat16 export restores the
  run's weights bit for bit."""
  workdir = str(tmp_path / "bf16")
  flags = (
      "--config=configs/pretrained.py:gpt2_trime",
      f"--config.train.init_from={imported_gpt2}",
      "--config.model.param_dtype=bfloat16",
      "--config.train.num_steps=2",
      "--config.train.checkpoint_every=2",
      "--config.train.log_every=1",
      "--config.train.eval_every=0",
      "--config.optim.warmup_steps=1",
      "--config.eval.max_windows=2",
      "--config.eval.splits=('valid',)",
      "--config.datastore.split=valid",
      "--config.datastore.max_windows=2",
      f"--workdir={workdir}",
  )
  proc = run_main(*flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  losses = _losses(workdir)
  assert sorted(losses) == [1, 2] and all(np.isfinite(list(losses.values())))
  run = dispatch.restore(workdir, with_optimizer=True)
  assert {x.dtype for x in jax.tree.leaves(run.params)} == {
      np.dtype(jnp.bfloat16)
  }
  moments = [
      x
      for x in jax.tree.leaves(run.opt_state)
      if jnp.issubdtype(x.dtype, jnp.floating) and x.ndim
  ]
  assert moments and {x.dtype for x in moments} == {np.dtype(np.float32)}
  proc = run_main(*flags, "--mode=datastore")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert os.listdir(os.path.join(workdir, "datastore"))
  proc = run_main(*flags, "--mode=export", "--config.export.dtype=bfloat16")
  assert proc.returncode == 0, proc.stderr[-3000:]
  export = memjax.load(os.path.join(workdir, "export")).restored
  for x, y in zip(jax.tree.leaves(run.params), jax.tree.leaves(export.params)):
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
