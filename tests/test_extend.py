"""Plug-in points: a feed-forward kind and an objective registered from here.

Nothing in memjax/ knows the gated feed-forward or the L2-penalised
objective below; they register under new names and a config picks them, as a
new memory method would.
"""

import glob
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import trime_wt103
from memjax import errors
from memjax import experiment
from memjax import losses
from memjax import registry
from memjax.run import loop


class GatedFeedForward(nn.Module):
  """GLU feed-forward: wo(act(wi_gate x) * wi x), width ``d_hidden``."""

  d_model: int
  d_ff: int
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  d_hidden: int = 0  # 0 = d_ff

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    """[B, T, D] -> [B, T, D]."""
    width = self.d_hidden or self.d_ff
    dense = lambda n, name: nn.Dense(n, dtype=self.dtype, name=name)
    h = nn.silu(dense(width, "wi_gate")(x)) * dense(width, "wi")(x)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return dense(self.d_model, "wo")(h)


def make_l2_loss(cfg, num_steps, seed=0):
  """The LM loss plus ``loss.options.l2_weight`` * mean squared g."""
  del num_steps, seed
  weight = float(cfg.options.get("l2_weight", 1e-3))

  def loss_fn(output, batch, *, step, rng):
    lm, metrics = losses.lm_loss(output, batch, step=step, rng=rng)
    penalty = jnp.mean(jnp.square(output.features.astype(jnp.float32)))
    loss = lm + weight * penalty
    tokens = metrics["tokens"]
    return loss, {
        "nll_sum": loss * tokens,
        "tokens": tokens,
        "aux_l2_penalty_sum": jax.lax.stop_gradient(penalty * tokens),
    }

  return loss_fn


@pytest.fixture(scope="module", autouse=True)
def plugins():
  registry.FEED_FORWARD.register("gated", GatedFeedForward)
  registry.OBJECTIVES.register("l2", make_l2_loss)
  yield
  registry.FEED_FORWARD.remove("gated")
  registry.OBJECTIVES.remove("l2")


def _config():
  c = trime_wt103.get_config("smoke")
  c.model.feed_forward = "gated"
  c.model.feed_forward_options.d_hidden = 48
  c.loss.name = "l2"
  c.loss.options.l2_weight = 0.01
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


def test_smoke_run_with_a_registered_feed_forward_and_objective(tmp_path):
  config = _config()
  workdir = str(tmp_path / "run")
  res = loop.train_and_evaluate(config, workdir)
  assert res["step"] == 4 and np.isfinite(res["valid"]["ppl"])
  # The objective's extra metric was computed and logged.
  penalty = _scalars(workdir)["train/l2_penalty"]
  assert penalty and all(np.isfinite(p) and p > 0 for p in penalty)
  # The run restores with the kind's own parameters, built with its options.
  restored = experiment.load(workdir)
  ffn = restored.params["layer_0"]["ffn"]
  assert set(ffn) == {"wi_gate", "wi", "wo"}
  assert ffn["wi_gate"]["kernel"].shape == (32, 48)
  assert restored.config.loss.options.l2_weight == 0.01


def test_the_signature_names_a_registered_kind_and_omits_the_default():
  config = _config()
  sig = experiment.model_signature(config, 100)["model"]
  assert sig["feed_forward"] == "gated"
  assert sig["feed_forward_options"] == {"d_hidden": 48}
  default = experiment.model_signature(trime_wt103.get_config("smoke"), 100)
  # Models saved before these keys existed keep matching their configs.
  assert not {"family", "feed_forward", "feed_forward_options"} & set(
      default["model"]
  )


@pytest.mark.parametrize(
    "key, value, registered",
    [
        ("model.feed_forward", "nope", "ffn, gated"),
        ("model.attention", "nope", "lamemo, rpe, vanilla, xl"),
        ("model.family", "nope", "decoder_lm, encoder, encoder_decoder, marge"),
        ("loss.name", "nope", "l2, label_smoothed, lm, trime"),
        (
            "data.batching",
            "nope",
            "blocks, bm25, consecutive, marge, mlm, random, sentences, tokens,"
            " tokens_bm25",
        ),
    ],
)
def test_an_unknown_name_lists_the_registered_ones(key, value, registered):
  config = _config()
  section, name = key.split(".")
  config[section][name] = value
  with pytest.raises(errors.ConfigError) as e:
    experiment.validate_config(config)
  assert f"unknown {key} 'nope'" in str(e.value)
  assert f"registered: {registered}" in str(e.value)


def test_an_unknown_task_lists_the_registered_ones():
  config = _config()
  config.task = "nope"
  with pytest.raises(
      errors.ConfigError,
      match="unknown task 'nope'.*: classification, lm, mlm, translation",
  ):
    experiment.validate_config(config)


def test_an_unknown_evaluation_memory_and_mode_list_the_registered_ones():
  with pytest.raises(
      errors.ConfigError, match="cache, knn, knn_cache, none, trime, trime_ext"
  ):
    registry.EVAL_MEMORIES.get("nope")
  with pytest.raises(errors.ConfigError, match="--mode 'nope'.*memeval"):
    registry.MODES.get("nope")


def test_a_registered_config_check_runs_before_anything_is_written():
  def check(config):
    if config.model.feed_forward == "gated" and config.model.d_ff < 100:
      raise errors.ConfigError("gated needs model.d_ff >= 100")

  registry.CONFIG_CHECKS.register("gated_width", check)
  try:
    config = _config()
    with pytest.raises(errors.ConfigError, match="gated needs"):
      experiment.validate_config(config)
    config.model.d_ff = 128
    experiment.validate_config(config)
  finally:
    registry.CONFIG_CHECKS.remove("gated_width")
  # The built-in check of TRIMELM_long's batches is registered the same way.
  assert "trime_long_batching" in registry.CONFIG_CHECKS.names()


def test_an_option_the_kind_does_not_take_is_refused():
  config = _config()
  config.model.feed_forward_options.width = 3
  model = experiment.build_model(config.model, 5000)
  tokens = jnp.zeros((1, 4), jnp.int32)
  with pytest.raises(errors.ConfigError, match="width.*d_hidden"):
    model.init(jax.random.PRNGKey(0), tokens, tokens)


def test_registry_register_lookup_and_names():
  reg = registry.Registry("widget", "widgets.kind")

  @reg.register("b")
  def b():
    return "b"

  reg.register("a", 1)
  assert reg.get("b") is b and reg.get("a") == 1
  assert reg.names() == ("a", "b") and "a" in reg and "c" not in reg
  with pytest.raises(ValueError, match="already registered"):
    reg.register("a", 2)
  reg.register("a", 2, replace=True)
  assert reg.get("a") == 2
  with pytest.raises(errors.ConfigError, match="widgets.kind 'c'.*a, b"):
    reg.get("c")


def test_methods_are_found_and_declare_modules_that_exist():
  import importlib  # pylint: disable=g-import-not-at-top

  names = [m.__name__.rsplit(".", 1)[1] for m in registry.methods()]
  assert names == ["cache", "external", "marge", "pkm", "recurrent", "trime"]
  for method in registry.methods():
    for reg, modules in method.REGISTERS.items():
      assert isinstance(getattr(registry, reg), registry.Registry), reg
      for module in modules:
        importlib.import_module(module)  # every listed module exists
    for mode, declared in getattr(method, "MODES", {}).items():
      assert registry.MODES.get(mode) == registry.as_mode(declared)
      assert declared["help"] and declared["kinds"], mode
      module, fn = declared["run"].split(":")
      assert callable(getattr(importlib.import_module(module), fn))
  # What the methods register is there without importing them by hand.
  assert {"lamemo", "xl"} <= set(registry.ATTENTION.names())
  assert {"pkm", "resm"} <= set(registry.FEED_FORWARD.names())
  assert "marge_reindex" in registry.HOOKS.names()
  assert "lazy_adam" in registry.OPTIMIZER_TRANSFORMS.names()
  assert "memory" in registry.SUM_REPORTS.names()


def test_each_method_owns_its_config_keys():
  # The engine's base has no method keys; each method's section adds them.
  from memjax import config as config_lib  # pylint: disable=g-import-not-at-top

  full = config_lib.base_config()
  engine = ml_collections.ConfigDict()
  engine.name, engine.seed, engine.task = "x", 0, "lm"
  for section in config_lib.ENGINE_SECTIONS:
    section(engine)
  assert "memory" in full.loss and "memory" not in engine.loss
  assert "temperature" in full.eval_memory
  assert "temperature" not in engine.eval_memory
  assert "datastore" in full and "datastore" not in engine
  assert "memory_usage" in full and "extrapolate" in full
  assert tuple(full.eval_memory.sweep_kinds) == ("trime", "cache")


def test_a_hook_must_be_a_step_hook():
  with pytest.raises(TypeError, match="not a StepHook subclass"):
    registry.HOOKS.register("test_not_a_hook", object)
