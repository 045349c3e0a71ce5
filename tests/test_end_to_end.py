"""End to end: the smoke config through memjax.main, resume, and bad input."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import trime_wt103
from memjax import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_main(*args, timeout=600):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # One CPU device, as a user's laptop has.
  return subprocess.run(
      [sys.executable, "-m", "memjax.main", *args],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
  )


def _losses(workdir):
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f)}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("smoke"))
  proc = _run_main(
      "--config=configs/trime_wt103.py:smoke", f"--workdir={workdir}"
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, proc


def test_smoke_writes_events_checkpoint_and_results(smoke_run):
  workdir, proc = smoke_run
  assert glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "20", "state"))
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["step"] == 20
  for split in ("valid", "test"):
    r = results[split]
    assert np.isfinite(r["ppl"]) and r["ppl"] == pytest.approx(np.exp(r["nll"]))
    assert r["tokens"] > 0
  assert "valid: ppl" in proc.stdout and "test: ppl" in proc.stdout


def test_second_run_with_more_steps_resumes(smoke_run):
  workdir, _ = smoke_run
  proc = _run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--config.train.num_steps=25",
      "--config.train.checkpoint_every=5",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resumed from" in proc.stdout and "at step 20" in proc.stdout
  assert "training from step 20 to 25" in proc.stdout
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f)["step"] == 25


def test_checkpoint_of_another_model_is_refused_and_kept(smoke_run):
  workdir, _ = smoke_run
  ckpt_dir = os.path.join(workdir, "checkpoints")
  before = sorted(os.listdir(ckpt_dir))
  proc = _run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--config.model.d_model=48",
      "--config.train.num_steps=40",
  )
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert (
      err[-1].startswith("memjax: error: checkpoint")
      and "d_model: 32 -> 48" in err[-1]
  )
  assert sorted(os.listdir(ckpt_dir)) == before


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--config.foo=1"], "unknown config key foo"),
        (["--config.data.data_dir=/nonexistent/wt"], "/nonexistent/wt"),
        (["--config.mesh.data=3"], "has 3 devices but 1 are available"),
        (
            ["--config.data.batch_size=7", "--config.train.grad_accum=2"],
            "not divisible",
        ),
    ],
)
def test_bad_input_exits_with_one_clear_line(tmp_path, args, needle):
  proc = _run_main(
      "--config=configs/trime_wt103.py:smoke", f"--workdir={tmp_path}", *args
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  lines = [
      l for l in proc.stderr.splitlines() if l.startswith("memjax: error:")
  ]
  assert len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]


class _Interrupt(Exception):
  pass


def test_interrupted_and_resumed_run_matches_uninterrupted(tmp_path):
  config = trime_wt103.get_config("smoke")
  config.train.num_steps = 8
  config.train.log_every = 1
  config.train.checkpoint_every = 4
  config.train.eval_every = 0
  config.eval.max_windows = 4
  whole = str(tmp_path / "whole")
  res_whole = train.train_and_evaluate(config, whole)

  def stop_after_4(step, state):
    if step == 4:
      raise _Interrupt()

  parts = str(tmp_path / "parts")
  with pytest.raises(_Interrupt):
    train.train_and_evaluate(config, parts, hooks=(stop_after_4,))
  res_parts = train.train_and_evaluate(config, parts)
  a, b = _losses(whole), _losses(parts)
  assert sorted(a) == list(range(1, 9)) and sorted(b) == list(range(1, 9))
  np.testing.assert_allclose(
      [a[s] for s in range(1, 9)], [b[s] for s in range(1, 9)], rtol=1e-6
  )
  assert res_parts["valid"]["nll"] == pytest.approx(
      res_whole["valid"]["nll"], rel=1e-6
  )


def test_init_from_restores_parameters_of_another_run(smoke_run, tmp_path):
  workdir, _ = smoke_run
  with open(os.path.join(workdir, "results.json")) as f:
    source = json.load(f)
  config = trime_wt103.get_config("smoke")
  config.train.init_from = workdir
  # The source run trained on one device; this one restores onto eight.
  res = train.train_and_evaluate(config, str(tmp_path / "from"), mode="eval")
  assert res["step"] == 0  # A fresh state whose parameters came from elsewhere.
  assert res["valid"]["nll"] == pytest.approx(source["valid"]["nll"], rel=1e-5)
