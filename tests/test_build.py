"""memjax.build: the run built once, and the Python API on a trained run.

The config is read once into typed settings that hold its values; a bad
config is refused before anything is written; ``memjax.load(...).score``
must reproduce ``--mode=eval`` and ``--mode=memeval`` on the same tokens;
an export written on one device must load on eight and score the same;
``init_from`` restores the shared parameters only.
"""

import importlib
import dataclasses
import json
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import memjax
from configs import trime_wt103
from memjax import build
from memjax import dispatch
from memjax import errors
from memjax import settings as settings_lib
from memjax.data import corpus as corpus_lib
from memjax.data import windows
from memjax.modes import evaluation as evaluation_mode
from memjax.modes import memory_eval as memory_modes
from memjax.run import init_from
from memjax.run import step as step_lib
from tests.conftest import run_main


def _valid_prefix(config, workdir):
  s = build.build(config, workdir).settings
  corpus = corpus_lib.load_corpus(
      s.data, s.eval, workdir, ("valid",), train=False
  )
  e = s.eval
  return windows.truncate_windows(
      corpus.splits["valid"].tokens, e.window_len, e.score_len, e.max_windows
  )


def test_saved_config_round_trips(smoke_workdir):
  saved = dispatch.saved_config(smoke_workdir)
  config = trime_wt103.get_config("smoke")
  assert saved.to_dict() == config.to_dict()
  assert isinstance(saved.model.cutoffs, tuple)


def test_the_settings_hold_the_config_values_typed():
  config = trime_wt103.get_config("smoke")
  config.eval.batch_size = 3
  run = build.build(config, "unused")
  s = run.settings
  assert (s.name, s.seed, s.task) == (config.name, config.seed, "lm")
  for cls, got in s.sections.items():
    assert dataclasses.asdict(got) == settings_lib.plain(
        config[cls.SECTION]
    ), cls.SECTION
  assert s.eval.batch_size == 3 and isinstance(s.model.cutoffs, tuple)
  # Every section has one owner, which reads every key of it.
  owners = [cls.SECTION for cls in s.sections]
  assert len(owners) == len(set(owners))
  assert set(owners) == {k for k, v in config.items() if hasattr(v, "keys")}
  # Settings are frozen; a changed copy rebuilds what depends on them.
  with pytest.raises(Exception, match="cannot assign"):
    s.eval.batch_size = 4  # pytype: disable=attribute-error
  other = run.replace(dataclasses.replace(s.eval, batch_size=5))
  assert other.settings.eval.batch_size == 5 and s.eval.batch_size == 3
  assert other.task is not run.task and other.task.settings is other.settings
  assert settings_lib.replaced(s.eval, batch_size=6).batch_size == 6
  with pytest.raises(errors.ConfigError, match="eval has no key nope"):
    settings_lib.replaced(s.eval, nope=1)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("optim.learning_rate", -1.0, "optim.learning_rate"),
        ("data.batch_size", 0, "data.batch_size"),
        ("eval_memory.kind", "nope", "unknown eval_memory.kind 'nope'"),
        ("mesh.data", 3, "mesh"),
    ],
)
def test_a_bad_config_is_refused_before_anything_is_written(
    tmp_path, key, value, message
):
  config = trime_wt103.get_config("smoke")
  section, name = key.split(".")
  config[section][name] = value
  workdir = tmp_path / "run"
  with pytest.raises(errors.UserError, match=message):
    dispatch.run_mode("train", config, str(workdir))
  assert not workdir.exists()


def test_a_mode_without_a_config_takes_the_saved_one_with_overrides(
    smoke_workdir, tmp_path
):
  config = dispatch.resolve("eval", None, smoke_workdir, {"eval.batch_size": 2})
  saved = trime_wt103.get_config("smoke")
  assert config.eval.batch_size == 2 and config.name == saved.name
  assert config.eval.window_len == saved.eval.window_len
  with pytest.raises(errors.ConfigError, match="--mode=eval needs --config"):
    dispatch.resolve("eval", None, str(tmp_path), None)


def test_score_reproduces_eval_and_memeval(smoke_workdir, tmp_path):
  config = trime_wt103.get_config("smoke")
  config.train.init_from = smoke_workdir
  out = str(tmp_path / "eval")
  os.makedirs(out)
  res = evaluation_mode.evaluate_run(build.build(config, out))
  mem = memory_modes.memeval(build.build(config, out))
  model = memjax.load(smoke_workdir)
  tokens = _valid_prefix(config, out)
  plain = model.score(tokens, memory=False)
  assert plain["tokens"] == res["valid"]["tokens"]
  assert plain["nll"] == pytest.approx(res["valid"]["nll"], rel=1e-5)
  assert model.memory["kind"] == config.eval_memory.kind == "cache"
  with_mem = model.score(tokens)
  assert with_mem["nll"] == pytest.approx(
      mem["valid"]["memory"]["nll"], rel=1e-5
  )
  assert with_mem["nll"] != pytest.approx(plain["nll"], rel=1e-6)
  # Per-token log-probabilities add up to the reported NLL.
  lp = plain["logprobs"][0]
  assert lp.shape == (len(tokens) - 1,)
  assert -lp.mean() == pytest.approx(plain["nll"], rel=1e-5)


def test_score_texts_and_generate(smoke_workdir):
  model = memjax.load(smoke_workdir)
  r = model.score(["the cat sat on the mat", "in 1990 the team won"])
  assert [len(x) for x in r["logprobs"]] == [5, 4]
  assert np.isfinite(r["ppl"]) and r["tokens"] == 9
  a = model.generate("the history of", num_tokens=6, seed=3)
  b = model.generate("the history of", num_tokens=6, seed=3)
  assert isinstance(a, str) and a == b and 1 <= len(a.split()) <= 6
  ids = model.generate(model.encode("the history of"), num_tokens=4)
  assert ids.shape == (4,) and ids.dtype == np.int32


def test_export_on_one_device_loads_on_eight(smoke_workdir, tmp_path):
  out = str(tmp_path / "export")
  proc = run_main(
      "--mode=export", f"--workdir={smoke_workdir}", f"--export_dir={out}"
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"to {out}:" in proc.stdout and "MiB" in proc.stdout
  assert sorted(os.listdir(out)) == [
      "config.json",
      "export.json",
      "params",
      "vocab.json",
      "vocab.txt",
  ]
  assert jax.device_count() == 8
  exported = memjax.load(out)
  assert exported.restored.mesh.size == 8 and exported.step == 20
  run = memjax.load(smoke_workdir, mesh={"data": 1})
  tokens = _valid_prefix(dispatch.saved_config(smoke_workdir), smoke_workdir)
  tokens = tokens[:300]
  a = run.score(tokens, memory=False)["logprobs"][0]
  b = exported.score(tokens, memory=False)["logprobs"][0]
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # The exported parameters are the run's, bit for bit.
  for x, y in zip(
      jax.tree.leaves(run.restored.params),
      jax.tree.leaves(exported.restored.params),
  ):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # A run of another model refuses it in one line naming the keys.
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={out}",
      "--mode=eval",
      "--config.model.d_model=48",
  )
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith("memjax: error:") and "d_model" in lines[-1]
  assert "Traceback" not in proc.stderr


def _bytes(directory: str) -> int:
  return sum(
      os.path.getsize(os.path.join(root, f))
      for root, _, files in os.walk(directory)
      for f in files
  )


def test_bfloat16_export_is_half_the_size(smoke_workdir, tmp_path):
  out = memjax.export(smoke_workdir, str(tmp_path / "bf16"), dtype="bfloat16")
  meta = json.load(open(os.path.join(out, "export.json")))
  assert meta["dtype"] == "bfloat16"
  model = memjax.load(out)
  leaves = jax.tree.leaves(model.restored.params)
  # Restored in the dtype it was written in (its config's param_dtype).
  assert all(x.dtype == jnp.bfloat16 for x in leaves)
  assert model.restored.run.settings.model.param_dtype == "bfloat16"
  run = memjax.load(smoke_workdir)
  params = jax.tree.leaves(run.restored.params)
  for x, y in zip(params, leaves):
    # Each value is the run's float32 rounded to the nearest bfloat16.
    np.testing.assert_array_equal(
        np.asarray(x).astype(jnp.bfloat16), np.asarray(y)
    )
  # On disk every array is stored as bfloat16 (Orbax's own metadata): the
  # arrays hold half the bytes of the same export in float32. The files
  # are smaller too, by a share Orbax's layout (OCDBT data files,
  # compression) decides and varies from write to write (0.96-2.6 bytes of
  # the two per parameter measured), so only "smaller" is held there.
  f32 = memjax.export(smoke_workdir, str(tmp_path / "f32"))
  n = sum(x.size for x in params)
  for export, dtype, itemsize in (
      (out, jnp.bfloat16, 2),
      (f32, jnp.float32, 4),
  ):
    meta = ocp.PyTreeCheckpointer().metadata(os.path.join(export, "params"))
    stored = jax.tree.leaves(
        getattr(meta, "item_metadata", meta),
        is_leaf=lambda x: hasattr(x, "dtype"),
    )
    assert len(stored) == len(params)
    assert all(x.dtype == dtype for x in stored)
    stored_bytes = sum(
        int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in stored
    )
    assert stored_bytes == itemsize * n
  assert _bytes(out) < _bytes(f32)


def _fresh_state(run, seed):
  model = run.model(12907)
  tx, _ = run.optimizer()
  sample = {"inputs": np.zeros((8, 16), np.int32)}
  return step_lib.create_state(
      model,
      tx,
      run.mesh,
      sample,
      jax.random.PRNGKey(seed),
      run.state_collections(),
  )


def test_init_from_restores_shared_parameters_only(smoke_workdir):
  config = trime_wt103.get_config("smoke")
  config.model.num_layers = 3
  config.train.init_from = smoke_workdir
  run = build.build(config, "unused")
  fresh, shardings = _fresh_state(run, 7)
  state = init_from.init_params_from(run, smoke_workdir, fresh, shardings)
  source = flax.traverse_util.flatten_dict(
      memjax.load(smoke_workdir).restored.params, sep="/"
  )
  got = flax.traverse_util.flatten_dict(state.params, sep="/")
  init = flax.traverse_util.flatten_dict(fresh.params, sep="/")
  assert set(got) == set(init) and set(source) < set(got)
  for k, v in got.items():
    want = source[k] if k in source else init[k]
    np.testing.assert_array_equal(np.asarray(v), np.asarray(want))
  assert any(k.startswith("layer_2/") for k in set(got) - set(source))
  # A model whose shared parameters have other shapes is refused.
  config.model.d_model = 48
  wide = build.build(config, "unused")
  state, shardings = _fresh_state(wide, 0)
  with pytest.raises(errors.CheckpointMismatchError, match="differ in shape"):
    init_from.init_params_from(wide, smoke_workdir, state, shardings)


def test_signature_covers_the_whole_model_section():
  run = build.build(trime_wt103.get_config("smoke"), "unused")
  sig = run.signature(100)["model"]
  assert "attention_options" in sig and "scale_embedding" in sig
  for runtime in settings_lib.Model.RUNTIME_KEYS:
    assert runtime not in sig
  want = {f.name for f in dataclasses.fields(run.settings.model)} - set(
      settings_lib.Model.RUNTIME_KEYS
  )
  assert set(sig) == want | {"vocab_size"}


def test_load_with_a_config_of_another_model_is_refused(smoke_workdir):
  config = trime_wt103.get_config("smoke")
  config.model.d_model = 48
  with pytest.raises(errors.CheckpointMismatchError, match="d_model"):
    dispatch.restore(smoke_workdir, config=config)
  # Another runtime key is taken: the same model evaluated in bfloat16.
  config = trime_wt103.get_config("smoke")
  config.model.dtype = "bfloat16"
  restored = dispatch.restore(smoke_workdir, config=config)
  assert restored.settings.model.dtype == "bfloat16" and restored.step == 20


def test_load_of_an_empty_directory_says_what_is_missing(tmp_path):
  with pytest.raises(errors.MissingRunError, match="no trained run"):
    memjax.load(str(tmp_path))


def test_paper_size_configs_follow_the_authors_layer_norm():
  from configs import lamemo_wt103  # pylint: disable=g-import-not-at-top
  from configs import trime_enwik8  # pylint: disable=g-import-not-at-top
  from configs import txl_wt103  # pylint: disable=g-import-not-at-top

  for mod, arg in (
      (txl_wt103, "base"),
      (txl_wt103, "enwik8"),
      (txl_wt103, "rpe_text8"),
      (lamemo_wt103, "base"),
  ):
    m = mod.get_config(arg).model
    assert (m.norm_position, m.norm_epsilon) == ("post", 1e-5), arg
  for mod, arg in (
      (trime_wt103, "247m"),
      (trime_wt103, "trime_150m"),
      (trime_enwik8, "38m"),
  ):
    m = mod.get_config(arg).model
    assert (m.norm_position, m.norm_epsilon) == ("pre", 1e-5), arg
    assert m.scan_layers, arg  # Scanned by default at paper sizes.
  for mod, arg in (
      (txl_wt103, "demo"),
      (lamemo_wt103, "smoke"),
      (trime_wt103, "demo"),
  ):
    m = mod.get_config(arg).model
    assert (m.norm_position, m.norm_epsilon) == ("pre", 1e-6), arg
    assert not m.scan_layers, arg
  m = trime_wt103.get_config("247m").model
  assert not m.final_layer_norm
  assert m.feed_forward_options.activation_dropout == 0.1


@pytest.mark.parametrize(
    "config_file, variant",
    [("pkm_bert", "pkm_smoke"), ("trime_iwslt", "smoke")],
)
def test_a_sliding_window_on_a_family_that_reads_sequences_whole_is_refused(
    tmp_path, config_file, variant
):
  module = importlib.import_module(f"configs.{config_file}")
  config = module.get_config(variant)
  config.model.attention_options.sliding_window = 4
  workdir = tmp_path / "run"
  with pytest.raises(
      errors.ConfigError, match="does not take a sliding window"
  ):
    dispatch.run_mode("train", config, str(workdir))
  assert not workdir.exists()
