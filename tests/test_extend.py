"""memjax.extend and memjax.catalog: method specs, found and added.

The method defined outside memjax is the one docs/extending.md shows: the
test runs the page's code block, so the page stays true. Nothing in memjax/
knows its gated feed-forward, its L2-penalised objective, its ``l2``
section, its check or its mode; a config picks them by name.
"""

import dataclasses
import glob
import os
import re
import subprocess
import sys
import types
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
import pytest

import memjax
from configs import trime_wt103
from memjax import build
from memjax import dispatch
from memjax import catalog
from memjax import config as config_lib
from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.run import hooks
from tests.conftest import REPO

DOC = os.path.join(REPO, "docs", "extending.md")


def _doc_method() -> types.ModuleType:
  """The module docs/extending.md's toy-method block defines (and adds)."""
  text = open(DOC).read()
  block = re.search(r"<!-- toy-method -->\n```python\n(.*?)```", text, re.S)
  module = types.ModuleType("toy_method")
  exec(compile(block.group(1), DOC, "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


@pytest.fixture(scope="module")
def toy():
  module = _doc_method()
  yield module
  extend.remove("gated_l2")


def _config(**l2):
  c = trime_wt103.get_config("smoke")
  c.model.feed_forward = "gated"
  c.model.feed_forward_options.d_hidden = 48
  c.loss.name = "l2"
  c.l2.weight = l2.get("weight", 0.01)
  c.train.num_steps = 4
  c.train.log_every = 2
  c.train.eval_every = 0
  c.train.checkpoint_every = 4
  c.eval.max_windows = 2
  return c


def _scalars(workdir):
  """{tag: [values]} of the TensorBoard events of a run."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  out = {}
  for path in glob.glob(os.path.join(workdir, "events.out.tfevents.*")):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for v in event.summary.value:
        value = (
            float(tf.make_ndarray(v.tensor))
            if v.HasField("tensor")
            else v.simple_value
        )
        out.setdefault(v.tag, []).append(value)
  return out


def test_the_documented_method_trains_restores_and_runs_its_mode(toy, tmp_path):
  config = _config()
  workdir = str(tmp_path / "run")
  res = memjax.train(config, workdir)
  assert res["step"] == 4 and np.isfinite(res["valid"]["ppl"])
  # The objective's extra metric was computed and logged, and is positive.
  penalty = _scalars(workdir)["train/l2_penalty"]
  assert penalty and all(np.isfinite(p) and p > 0 for p in penalty)
  # The run restores from its directory alone, with the kind's own
  # parameters built with its options and the method's section read back.
  restored = dispatch.restore(workdir)
  ffn = restored.params["layer_0"]["ffn"]
  assert set(ffn) == {"wi_gate", "wi", "wo"}
  assert ffn["wi_gate"]["kernel"].shape == (32, 48)
  assert restored.settings.of(toy.L2) == toy.L2(weight=0.01)
  # Its mode runs through the one dispatch and writes its file; the norms
  # are those of the restored kernels (an independent computation).
  out = memjax.run_mode("gate_norms", None, workdir)
  kernels = {
      f"layer_{i}": np.asarray(
          restored.params[f"layer_{i}"]["ffn"]["wi_gate"]["kernel"], np.float64
      )
      for i in range(config.model.num_layers)
  }
  want = {k: np.sqrt(np.sum(np.square(v))) for k, v in kernels.items()}
  assert out["step"] == 4
  np.testing.assert_allclose(
      [out["norms"][k] for k in sorted(want)],
      [want[k] for k in sorted(want)],
      rtol=1e-5,
  )
  assert os.path.isfile(os.path.join(workdir, "gate_norms.json"))


def test_the_method_check_and_section_are_read_before_anything_is_written(
    toy, tmp_path
):
  with pytest.raises(errors.ConfigError, match="l2.weight must be >= 0"):
    build.build(_config(weight=-1.0), str(tmp_path))
  assert not os.listdir(tmp_path)
  run = build.build(_config(weight=0.5), str(tmp_path))
  assert run.settings.of(toy.L2).weight == 0.5
  assert dataclasses.asdict(run.settings.of(toy.L2)) == {"weight": 0.5}


def test_a_config_made_before_the_method_was_added_is_one_clear_error(toy):
  extend.remove("gated_l2")
  try:
    config = trime_wt103.get_config("smoke")
  finally:
    extend.add(toy.METHOD)
  with pytest.raises(errors.ConfigError, match="no section l2"):
    build.build(config, "unused")


def test_the_signature_names_the_kind_and_its_options(toy):
  del toy
  run = build.build(_config(), "unused")
  sig = run.signature(100)
  assert sig["signature_version"] == 3
  assert sig["model"]["feed_forward"] == "gated"
  assert sig["model"]["feed_forward_options"] == {"d_hidden": 48}
  assert sig["model"]["vocab_size"] == 100
  # Runtime keys change how, not what, the model computes.
  assert not set(settings_lib.Model.RUNTIME_KEYS) & set(sig["model"])


@pytest.mark.parametrize(
    "key, value, declared",
    [
        (
            "model.feed_forward",
            "nope",
            "ffn, gated, glu, memory_plus, pkm, resm",
        ),
        ("model.attention", "nope", "lamemo, rpe, vanilla, xl"),
        ("model.family", "nope", "decoder_lm, encoder, encoder_decoder, marge"),
        ("loss.name", "nope", "l2, label_smoothed, lm, trime, trime_mt"),
        (
            "data.batching",
            "nope",
            "blocks, bm25, consecutive, marge, mlm, random, sentences, tokens,"
            " tokens_bm25",
        ),
    ],
)
def test_an_unknown_name_lists_the_declared_ones(toy, key, value, declared):
  del toy
  config = _config()
  section, name = key.split(".")
  config[section][name] = value
  with pytest.raises(errors.ConfigError) as e:
    build.build(config, "unused")
  assert f"unknown {key} 'nope'" in str(e.value)
  assert f"there are: {declared}" in str(e.value)


def test_an_unknown_task_evaluation_memory_and_mode_list_the_declared_ones():
  config = trime_wt103.get_config("smoke")
  config.task = "nope"
  with pytest.raises(
      errors.ConfigError,
      match="unknown task 'nope'.*: classification, lm, mlm, translation",
  ):
    build.build(config, "unused")
  parts = build.parts()
  with pytest.raises(
      errors.ConfigError, match="cache, knn, knn_cache, none, trime, trime_ext"
  ):
    parts.eval_memories.get("nope")
  with pytest.raises(errors.ConfigError, match="--mode 'nope'.*memeval"):
    dispatch.mode_of("nope")


def test_an_option_the_kind_does_not_take_is_refused(toy):
  del toy
  config = _config()
  config.model.feed_forward_options.width = 3
  with pytest.raises(errors.ConfigError, match="width.*d_hidden"):
    model = build.build(config, "unused").model(5000)
    tokens = jnp.zeros((1, 4), jnp.int32)
    model.init(__import__("jax").random.PRNGKey(0), tokens, tokens)


def test_lookup_gets_names_and_refuses_unknown_names():
  lookup = extend.Lookup("widget", "widgets.kind", {"b": 2, "a": 1})
  assert lookup.get("a") == 1 and lookup.get("b") == 2
  assert lookup.names() == ("a", "b") and "a" in lookup and "c" not in lookup
  assert list(lookup.items()) == [("a", 1), ("b", 2)]
  with pytest.raises(
      errors.ConfigError, match="unknown widgets.kind 'c'.*there are: a, b"
  ):
    lookup.get("c")


def test_two_specs_declaring_one_name_or_key_are_refused():
  one = extend.Method(name="one", objectives={"lm": lambda s, n: None})
  with pytest.raises(ValueError, match="training objective 'lm'.*'one'"):
    extend.Parts((catalog.ENGINE, one))
  with pytest.raises(TypeError, match="extend.Method"):
    extend.add("not a spec")
  extend.add(one)
  try:
    extend.add(one)  # The same spec again: nothing happens.
    assert extend.added().count(one) == 1
    with pytest.raises(ValueError, match="named 'one' was added"):
      extend.add(extend.Method(name="one"))
  finally:
    extend.remove("one")
  assert one not in extend.added()


def test_a_hook_must_be_a_step_hook():
  bad = extend.Method(name="bad_hook", hooks={"nope": object})
  with pytest.raises(TypeError, match="not a memjax.run.hooks.StepHook"):
    build._parts((catalog.ENGINE, bad))  # pylint: disable=protected-access
  assert issubclass(build.parts().hooks.get("marge_reindex"), hooks.StepHook)


def test_the_methods_are_found_with_what_they_declare():
  found = build.found()
  assert [m.name for m in found] == [
      "cache",
      "external",
      "marge",
      "pkm",
      "recurrent",
      "trime",
  ]
  for method in found:
    folder = os.path.join(build.METHODS_DIR, method.name)
    assert os.path.isfile(os.path.join(folder, "__init__.py"))
    for mode in method.modes.values():
      assert callable(mode.run) and mode.help, method.name
    for name in method.builds_on:
      assert name in {m.name for m in found}
  assert {m.name for m in found if m.builds_on} == {"external"}
  parts = build.parts()
  assert {"lamemo", "xl"} <= set(parts.attention.names())
  assert {"pkm", "resm"} <= set(parts.feed_forward.names())
  assert "marge_reindex" in parts.hooks.names()
  assert "lazy_adam" in parts.optimizer_transforms.names()
  assert "memory" in parts.sum_reports.names()


def test_each_section_has_one_owner():
  # Every section of the base config is declared by one settings class: the
  # engine's sections hold none of a method's keys, a method's keys sit in
  # its own sections.
  parts = build.parts()
  owners: dict[str, list[str]] = {}
  for cls in parts.settings:
    owners.setdefault(cls.SECTION, []).append(cls.__name__)
  assert all(len(v) == 1 for v in owners.values()), owners
  full = config_lib.base_config()
  sections = {k for k, v in full.items() if hasattr(v, "keys")}
  assert sections == set(owners)
  engine = {cls.SECTION for cls in catalog.ENGINE.settings}
  assert "memory" in full.trime and "trime" not in engine
  assert "memory" not in full.loss and "temperature" not in full.eval_memory
  assert "bm25_k" not in full.data and "cache_lambda" in full.cache
  assert "datastore" in engine and "mt_memory" not in engine
  assert "memory_usage" in full and "extrapolate" in full
  assert tuple(full.eval_memory.sweep_kinds) == ("trime", "cache")
  with pytest.raises(ValueError, match="a section has one owner"):
    settings_lib.check_owners([settings_lib.Data, _Twin])


@dataclasses.dataclass(frozen=True)
class _Twin:
  """A second class declaring the engine's ``data`` section (a bug)."""

  SECTION: ClassVar[str] = "data"
  seq_len: int = 1


def test_finding_the_methods_starts_no_jax_backend():
  # --mode=plan sets XLA's fake device count after the specs are read and
  # before the first backend starts: reading them must start none.
  script = (
      "from memjax import build, config\n"
      "build.parts(); config.base_config()\n"
      "from jax._src import xla_bridge\n"
      "assert not xla_bridge.backends_are_initialized(), 'started'\n"
      "print('ok')\n"
  )
  out = subprocess.run(
      [sys.executable, "-c", script],
      cwd=REPO,
      capture_output=True,
      text=True,
      check=False,
  )
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
