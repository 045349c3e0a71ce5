"""TransformerLM with carried memory (Transformer-XL, LaMemo) in training.

The memory's structure, the per-lane segment scan of the train step, and
the train step with its memory sharded over 8 fake devices. The model's
behaviour over segments (scan, causality, resets, sharding) is tested in
tests/models/test_recurrence.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from memjax import losses
from memjax import sharding as sharding_lib
from memjax.models import recurrence
from memjax.models import transformer
from memjax.run import step as train_step
from tests.models import helpers

V, B, T, M = 64, 8, 4, 6


def make_model(kind, **kwargs):
  """A two-layer LM of the attention kind named ``kind``."""
  return transformer.TransformerLM(
      cfg=helpers.tiny(
          V,
          num_layers=2,
          cutoffs=(16, 40),
          mem_len=M,
          attention=kind,
          **kwargs,
      )
  )


def tokens(seed, shape):
  return np.random.default_rng(seed).integers(0, V, shape).astype(np.int32)


def leaves(tree):
  return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_memory_structure_and_outputs_cover_the_segment(kind):
  model = make_model(kind)
  stream = tokens(0, (B, T + 1))
  inputs, targets = jnp.asarray(stream[:, :T]), jnp.asarray(stream[:, 1:])
  params = model.init(jax.random.PRNGKey(0), inputs, targets)["params"]
  memory = model.init_memory(B)
  assert model.carries_memory()
  for leaf in jax.tree_util.tree_leaves(memory):
    assert leaf.shape[:2] == (B, M)
  out = jax.jit(
      lambda p, m: model.apply({"params": p}, inputs, targets, memory=m)
  )(params, memory)
  assert out.target_logprob.shape == (B, T)
  assert out.features.shape == out.hidden.shape == (B, T, 16)
  assert jax.tree_util.tree_structure(
      out.memory
  ) == jax.tree_util.tree_structure(memory)
  assert not make_model("rpe").carries_memory()
  assert make_model("rpe").init_memory(B) is None


# ---------------------------------------------------------------------------
# The train step with carried memory.
# ---------------------------------------------------------------------------


def _batches(lanes, m, steps, seed=1):
  """Consecutive lane-major batches: lane r's segments follow each other."""
  stream = tokens(seed, (lanes, steps * m * T + 1))
  out = []
  for k in range(steps):
    rows = []
    for r in range(lanes):
      for j in range(m):
        s = (k * m + j) * T
        rows.append(stream[r, s : s + T + 1])
    rows = np.stack(rows)
    out.append(
        {
            "inputs": rows[:, :-1],
            "targets": rows[:, 1:],
            "reset": np.full(lanes, k == 0),
        }
    )
  return stream, out


def _run_train_steps(kind, m, mesh_spec, devices, steps=2):
  model = make_model(kind)
  tx = optax.sgd(0.5)  # Adam would amplify rounding in ~0 gradients.
  _, batches = _batches(B, m, steps)
  mesh = sharding_lib.make_mesh(mesh_spec, devices)
  state, shardings = train_step.create_state(
      model, tx, mesh, batches[0], jax.random.PRNGKey(0)
  )
  step = train_step.make_train_step(
      model,
      tx,
      losses.lm_loss,
      grad_accum=1,
      state_shardings=shardings,
      mesh=mesh,
      segments_per_lane=m,
  )
  loss, history = [], [jax.device_get(state.params)]
  for b in batches:
    state, metrics = step(
        state, sharding_lib.put_global_batch(b, mesh), jax.random.PRNGKey(1)
    )
    loss.append(float(metrics["loss"]))
    history.append(jax.device_get(state.params))
  return state, loss, history


@functools.lru_cache(maxsize=None)
def unsharded_train(kind, m):
  """(final state, losses per step, params before and after each step)."""
  state, loss, history = _run_train_steps(
      kind, m, {"data": 1}, jax.devices()[:1]
  )
  return jax.device_get(state), loss, history


@pytest.mark.parametrize("kind,m", [("xl", 1), ("lamemo", 2)])
def test_train_step_with_memory_sharded_equals_unsharded(kind, m):
  assert len(jax.devices()) == 8
  ref_state, ref_loss, _ = unsharded_train(kind, m)
  state, loss, _ = _run_train_steps(kind, m, {"data": 8}, None)
  for leaf in jax.tree_util.tree_leaves(state.memory):
    assert len(leaf.addressable_shards) == 8
    assert leaf.addressable_shards[0].data.shape[0] == B // 8
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
      jax.device_get(state.params),
      ref_state.params,
  )
  for got, want in zip(
      leaves(jax.device_get(state.memory)), leaves(ref_state.memory)
  ):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_segments_per_lane_run_in_order_with_gradients_into_every_segment():
  """With m = 2 segments per lane, one train step equals running each
  lane's two segments one after the other (memory carried) and taking
  the gradient of the mean loss over both."""
  kind, m = "lamemo", 2
  model = make_model(kind)
  tx = optax.sgd(0.5)  # Adam would amplify rounding in ~0 gradients.
  _, batches = _batches(B, m, 2)  # as unsharded_train
  batch = batches[0]
  _, losses_per_step, history = unsharded_train(kind, m)
  params = history[0]
  rows = lambda j: np.arange(B) * m + j  # lane r's segment j

  def loss_fn(p):
    memory = model.init_memory(B)
    nll, outs = 0.0, []
    for j in range(m):
      out = model.apply(
          {"params": p},
          batch["inputs"][rows(j)],
          batch["targets"][rows(j)],
          memory=memory,
      )
      memory = out.memory
      nll = nll - jnp.sum(out.target_logprob)
      outs.append(out)
    return nll / (B * m * T), (memory, outs)

  (want_loss, (want_memory, want_outs)), grads = jax.jit(
      jax.value_and_grad(loss_fn, has_aux=True)
  )(params)
  updates, _ = tx.update(grads, tx.init(params), params)
  want_params = optax.apply_updates(params, updates)

  # The per-lane scan itself: outputs back in lane-major row order.
  got = jax.jit(
      lambda p: recurrence.run_lane_segments(
          model,
          p,
          batch,
          model.init_memory(B),
          m,
          rng=jax.random.PRNGKey(0),
          deterministic=True,
      )[0]
  )(params)
  for j in range(m):
    for name in ("features", "target_logprob"):
      np.testing.assert_allclose(
          np.asarray(getattr(got, name))[rows(j)],
          np.asarray(getattr(want_outs[j], name)),
          rtol=1e-5,
          atol=1e-5,
      )
  for g, w in zip(leaves(got.memory), leaves(want_memory)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

  # The train step: same loss and the same update.
  assert losses_per_step[0] == pytest.approx(float(want_loss), rel=1e-5)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      history[1],
      want_params,
  )
