"""The train step carries a model's state collections (a BatchNorm's
running statistics): once per micro-batch, in order, padding left out."""

import jax
import numpy as np
import optax

from memjax import build
from memjax import config as config_lib
from memjax import sharding as sharding_lib
from memjax.models import encoder
from memjax.run import step as train_step
from tests.models import helpers

KD, HEADS = 8, 2  # the memory's k_dim and heads: the query has 16 features


# The residual memory kind: its query's BatchNorm keeps 'batch_stats'.
RESM = build.parts().feed_forward.get("resm")


def _encoder():
  return encoder.Encoder(
      cfg=helpers.tiny(
          40,
          feed_forward_layers=(1,),
          max_len=16,
          feed_forward_options=dict(
              num_keys=4, heads=HEADS, topk=2, k_dim=KD, query_norm="batch"
          ),
          norm_position="post",
          norm_epsilon=1e-12,
          feed_forward="resm",
      )
  )


def _create_state(model, tx, mesh, batch):
  """The train state with the collections the residual memory keeps."""
  return train_step.create_state(
      model, tx, mesh, batch, jax.random.PRNGKey(0), RESM.state_collections
  )


def _base_loss():
  """The base config's objective (``loss.name`` 'lm')."""
  return build.build(config_lib.base_config(), "unused").objective(1)


def _queries(model, variables, inputs):
  """The memory's query before its norm, [B, T, H*k_dim] (the layer sees
  [B*T, D] rows), captured from a
  deterministic forward pass (the model has no dropout)."""
  _, state = model.apply(
      variables,
      inputs,
      inputs,
      deterministic=True,
      capture_intermediates=lambda m, _: m.name == "query",
      mutable=["intermediates"],
  )
  found = jax.tree.leaves(state["intermediates"])
  assert len(found) == 1
  return np.asarray(found[0], np.float64).reshape(inputs.shape + (-1,))


def test_batch_stats_follow_the_micro_batches_in_order_without_padding():
  model = _encoder()
  rng = np.random.default_rng(0)
  inputs = rng.integers(5, 40, size=(4, 10)).astype(np.int32)
  inputs[1, 6:] = 0  # padding in the first micro-batch (rows 0, 1)
  inputs[3, 3:] = 0  # and in the second (rows 2, 3)
  weights = (inputs > 0).astype(np.float32)
  batch = {"inputs": inputs, "targets": inputs, "weights": weights}
  mesh = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  tx = optax.sgd(0.1)
  state, shardings = _create_state(model, tx, mesh, batch)
  before = jax.device_get(state.model_state)
  norm = before["batch_stats"]["layer_0"]["ffn"]["memory"]["query_norm"]
  np.testing.assert_array_equal(norm["mean"], 0.0)
  np.testing.assert_array_equal(norm["var"], 1.0)
  q = _queries(model, state.variables, inputs)
  loss_fn = _base_loss()
  step = train_step.make_train_step(
      model, tx, loss_fn, grad_accum=2, state_shardings=shardings, mesh=mesh
  )
  new, _ = step(
      state, sharding_lib.put_global_batch(batch, mesh), jax.random.PRNGKey(1)
  )
  got = jax.device_get(new.model_state)["batch_stats"]["layer_0"]["ffn"]
  got = got["memory"]["query_norm"]
  # NumPy: per micro-batch, the mean and (biased) variance over its real
  # tokens, folded in with Flax's momentum 0.9, the first micro-batch first.
  mean, var = np.zeros(HEADS * KD), np.ones(HEADS * KD)
  for rows in ((0, 1), (2, 3)):
    real = q[list(rows)][inputs[list(rows)] > 0]
    mean = 0.9 * mean + 0.1 * real.mean(0)
    var = 0.9 * var + 0.1 * real.var(0)
  np.testing.assert_allclose(got["mean"], mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["var"], var, rtol=1e-5, atol=1e-6)
  # The other order gives other statistics: the order is the batch's.
  swapped = 0.9 * (0.9 * 0.0 + 0.1 * q[[2, 3]][inputs[[2, 3]] > 0].mean(0))
  swapped += 0.1 * q[[0, 1]][inputs[[0, 1]] > 0].mean(0)
  assert not np.allclose(swapped, got["mean"], rtol=1e-3)


def test_a_padded_position_does_not_move_the_statistics():
  model = _encoder()
  rng = np.random.default_rng(1)
  short = rng.integers(5, 40, size=(2, 6)).astype(np.int32)
  long = np.zeros((2, 12), np.int32)  # the same tokens, 6 padding each
  long[:, :6] = short
  mesh = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  loss_fn = _base_loss()
  stats_ = []
  for inputs in (short, long):
    batch = {
        "inputs": inputs,
        "targets": inputs,
        "weights": (inputs > 0).astype(np.float32),
    }
    state, shardings = _create_state(model, optax.sgd(0.1), mesh, batch)
    step = train_step.make_train_step(
        model,
        optax.sgd(0.1),
        loss_fn,
        grad_accum=1,
        state_shardings=shardings,
        mesh=mesh,
    )
    new, _ = step(
        state, sharding_lib.put_global_batch(batch, mesh), jax.random.PRNGKey(1)
    )
    stats_.append(jax.device_get(new.model_state))
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
      *stats_,
  )
  moved = stats_[0]["batch_stats"]["layer_0"]["ffn"]["memory"]["query_norm"]
  assert np.abs(moved["mean"]).max() > 1e-3  # the real tokens did move them


def test_a_model_without_state_collections_carries_none():
  model = encoder.Encoder(
      cfg=helpers.tiny(
          40,
          max_len=16,
          norm_position="post",
          norm_epsilon=1e-12,
      )
  )
  batch = {"inputs": np.ones((2, 4), np.int32)}
  mesh = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  # Asked for the collections a BatchNorm keeps, it made none.
  state, _ = _create_state(model, optax.sgd(0.1), mesh, batch)
  assert state.model_state is None
  assert state.variables is state.params
