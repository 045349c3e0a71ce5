"""Parameter groups of memjax.run.optim: labels, errors, a frozen group trains
nothing while the rest trains, and declared transformations (extend.Method)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import trime_wt103
from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax import sharding as sharding_lib
from memjax.run import optim
from memjax.run import position
from memjax.run import step as train_step_lib


def _params():
  return {
      "embedder": {"embed_0": jnp.zeros((4, 2))},
      "layer_0": {
          "attention": {"query": {"kernel": jnp.zeros((2, 1, 2))}},
          "ln_attn": {"scale": jnp.ones(2), "bias": jnp.zeros(2)},
      },
      "layer_1": {"attention": {"query": {"kernel": jnp.zeros((2, 1, 2))}}},
      "final_norm": {"scale": jnp.ones(2), "bias": jnp.zeros(2)},
  }


def _optim(**groups):
  """The base config's ``optim`` settings with ``groups``."""
  cfg = config_lib.base_config().optim
  for name, group in groups.items():
    cfg.groups[name] = ml_collections.ConfigDict(group)
  return settings_lib.read(settings_lib.Optim, cfg)


def _make_optimizer(cfg, num_steps):
  """``optim.make_optimizer`` with the declared transforms."""
  transforms = build.parts().optimizer_transforms
  return optim.make_optimizer(cfg, num_steps, transforms)


def _patterns(cfg):
  return {n: rx for n, (rx, _) in optim.group_settings(cfg).items()}


def test_labels_put_each_parameter_in_its_group():
  cfg = _optim(
      norms=dict(params=r"(^final_norm|ln_attn)/", learning_rate=0.0),
      first=dict(params=r"^layer_0/attention/", optimizer="sgd"),
  )
  labels = optim.param_labels(_params(), _patterns(cfg))
  assert labels == {
      "embedder": {"embed_0": "base"},
      "layer_0": {
          "attention": {"query": {"kernel": "first"}},
          "ln_attn": {"scale": "norms", "bias": "norms"},
      },
      "layer_1": {"attention": {"query": {"kernel": "base"}}},
      "final_norm": {"scale": "norms", "bias": "norms"},
  }
  # Boxed parameters (logical axis names) are labelled by the same paths.
  boxed = jax.tree.map(lambda x: nn.Partitioned(x, (None,) * x.ndim), _params())
  flat = jax.tree_util.tree_leaves(optim.param_labels(boxed, _patterns(cfg)))
  assert flat == jax.tree_util.tree_leaves(labels)
  settings = optim.group_settings(cfg)
  assert settings["norms"][1].learning_rate == 0.0
  assert settings["norms"][1].optimizer == "adam"  # Inherited from the base.
  assert settings["first"][1].optimizer == "sgd"


def test_group_errors_name_the_group():
  with pytest.raises(errors.ConfigError, match=r"optim.groups.ghost.params "):
    optim.param_labels(
        _params(), _patterns(_optim(ghost=dict(params="^decoder/")))
    )
  with pytest.raises(errors.ConfigError, match="matches optim.groups"):
    optim.param_labels(
        _params(),
        _patterns(_optim(a=dict(params="layer_0"), b=dict(params="ln_attn"))),
    )
  with pytest.raises(
      errors.ConfigError, match=r"groups.x: unknown keys \['lr'"
  ):
    optim.group_settings(_optim(x=dict(params="a", lr=0.1)))
  with pytest.raises(errors.ConfigError, match="groups.x.params"):
    optim.group_settings(_optim(x=dict(learning_rate=0.1)))
  with pytest.raises(errors.ConfigError, match="not a regex"):
    optim.group_settings(_optim(x=dict(params="(")))
  with pytest.raises(errors.ConfigError, match="'base' is reserved"):
    optim.group_settings(_optim(base=dict(params="a")))
  with pytest.raises(errors.ConfigError, match="unknown optim.groups.x.trans"):
    _make_optimizer(_optim(x=dict(params="a", transform="nope")), 10)
  # Through the optimiser: the error comes at init, before any update.
  tx, _ = _make_optimizer(_optim(ghost=dict(params="^decoder/")), 10)
  with pytest.raises(errors.ConfigError, match="ghost"):
    tx.init(_params())


def test_registered_transform_updates_its_group_only():
  seen = {}

  def scaled_sgd(cfg, sched):
    seen["lr"] = cfg.learning_rate
    return optax.sgd(lambda step: 2.0 * sched(step))

  method = extend.Method(
      name="test_scaled_sgd",
      optimizer_transforms={"test_scaled_sgd": scaled_sgd},
  )
  cfg = _optim(
      norms=dict(
          params="^final_norm/",
          transform="test_scaled_sgd",
          learning_rate=0.5,
          schedule="constant",
          warmup_steps=0,
      )
  )
  extend.add(method)
  try:
    tx, _ = _make_optimizer(cfg, 10)
  finally:
    extend.remove(method.name)
  params = _params()
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  assert seen["lr"] == 0.5
  np.testing.assert_allclose(updates["final_norm"]["scale"], [-1.0, -1.0])
  # Adam's first step with a zero learning rate (warm-up) elsewhere.
  kernel = updates["layer_1"]["attention"]["query"]["kernel"]
  np.testing.assert_array_equal(kernel, 0.0)


def _data_position(config, step):
  """What a checkpoint of the run ``config`` describes saves at ``step``."""
  run = build.build(config, "run")
  return position.data_position(run.settings, run.task.data_settings(), step)


def _check_position(config, saved):
  """Resuming ``saved`` with ``config``, as the loop checks it."""
  extend_schedule = build.build(config, "run").settings.train.extend_schedule
  position.check_position(
      _data_position(config, 0), saved, "run", extend_schedule
  )


def test_resume_with_other_groups_is_refused():
  config = trime_wt103.get_config("smoke")
  saved = _data_position(config, 10)
  config.optim.groups.frozen = ml_collections.ConfigDict(
      {"params": "^final_norm/", "learning_rate": 0.0}
  )
  with pytest.raises(errors.ResumeError, match="optimiser layout"):
    _check_position(config, saved)
  # Only the learning rate of a group changes: its state still fits.
  saved = _data_position(config, 10)
  config.optim.groups.frozen.learning_rate = 1e-4
  _check_position(config, saved)


def test_group_with_zero_learning_rate_stays_bit_identical(tmp_path):
  config = trime_wt103.get_config("smoke")
  config.data.cache_dir = str(tmp_path / "cache")
  config.optim.groups.frozen = ml_collections.ConfigDict(
      {"params": "^(final_norm|layer_0)/", "learning_rate": 0.0}
  )
  run = build.build(config, str(tmp_path))
  mesh = run.mesh
  corpus = run.task.load(str(tmp_path))
  batcher = run.batcher(corpus.train, corpus.cache_dir)
  model = run.model(corpus.vocab_size)
  tx, schedule = run.optimizer(10)
  state, shardings = train_step_lib.create_state(
      model,
      tx,
      mesh,
      run.host_batch(batcher, 0),
      jax.random.PRNGKey(0),
      run.state_collections(),
  )
  step = train_step_lib.make_train_step(
      model,
      tx,
      run.objective(10),
      grad_accum=1,
      state_shardings=shardings,
      mesh=mesh,
  )
  before = jax.device_get(state.params)
  for i in range(10):
    batch = sharding_lib.put_global_batch(run.host_batch(batcher, i), mesh)
    state, metrics = step(state, batch, jax.random.PRNGKey(1))
    assert float(metrics["finite"]) == 1.0
  after = jax.device_get(state.params)
  assert float(schedule(5)) == pytest.approx(2e-3)  # The base schedule.
  frozen = changed = 0
  for (path, a), b in zip(
      jax.tree_util.tree_flatten_with_path(before)[0], jax.tree.leaves(after)
  ):
    name = optim.path_name(path)
    if name.startswith(("final_norm/", "layer_0/")):
      assert np.array_equal(a, b) and a.dtype == b.dtype, name
      frozen += 1
    else:
      changed += int(not np.array_equal(a, b))
  assert frozen >= 10  # Both final_norm leaves and layer_0's.
  assert changed == len(jax.tree.leaves(after)) - frozen  # The rest trains.
