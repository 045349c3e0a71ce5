"""TransformerLM with carried memory (Transformer-XL, LaMemo), end to end.

Scan against a Python loop, causality across segments through the full
model, lane resets, the per-lane segment scan of the train step, and the
train step with its memory sharded over 8 fake devices.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from memjax import losses
from memjax import sharding as sharding_lib
from memjax import experiment
from memjax import train_step
from memjax.models import recurrence
from memjax.models import transformer

V, B, T, M, S = 64, 8, 4, 6, 3


def make_model(kind, **kwargs):
  return transformer.TransformerLM(
      vocab_size=V,
      num_layers=2,
      d_model=16,
      num_heads=2,
      head_dim=8,
      d_ff=32,
      cutoffs=(16, 40),
      attention=kind,
      mem_len=M,
      **kwargs,
  )


def tokens(seed, shape):
  return np.random.default_rng(seed).integers(0, V, shape).astype(np.int32)


@functools.lru_cache(maxsize=None)
def setup(kind):
  """(model, params, stream [B, S*T + 1], jitted scan, jitted step)."""
  model = make_model(kind)
  stream = tokens(0, (B, S * T + 1))
  params = model.init(
      jax.random.PRNGKey(0),
      jnp.asarray(stream[:, :T]),
      jnp.asarray(stream[:, 1 : T + 1]),
  )["params"]

  def step(params, memory, inputs, targets):
    out = model.apply({"params": params}, inputs, targets, memory=memory)
    return out.memory, out.replace(memory=None)

  def scan(params, memory, stream):
    segs = recurrence.split_segments(
        {"inputs": stream[:, :-1], "targets": stream[:, 1:]}, T
    )
    return jax.lax.scan(
        lambda m, s: (lambda r: (r[0], (r[1], r[0])))(
            step(params, m, s["inputs"], s["targets"])
        ),
        memory,
        segs,
    )

  return model, params, stream, jax.jit(scan), jax.jit(step)


def leaves(tree):
  return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def at(tree, s):
  return jax.tree_util.tree_map(lambda a: a[s], tree)


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_memory_structure_and_outputs_cover_the_segment(kind):
  model, params, stream, _, step = setup(kind)
  memory = model.init_memory(B)
  assert model.carries_memory()
  for leaf in jax.tree_util.tree_leaves(memory):
    assert leaf.shape[:2] == (B, M)
  new_memory, out = step(params, memory, stream[:, :T], stream[:, 1 : T + 1])
  assert out.target_logprob.shape == (B, T)
  assert out.features.shape == out.hidden.shape == (B, T, 16)
  assert jax.tree_util.tree_structure(
      new_memory
  ) == jax.tree_util.tree_structure(memory)
  assert not make_model("rpe").carries_memory()
  assert make_model("rpe").init_memory(B) is None


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_scan_over_segments_equals_python_loop(kind):
  model, params, stream, scan, step = setup(kind)
  final, (outs, mems) = scan(params, model.init_memory(B), stream)
  memory = model.init_memory(B)
  for s in range(S):
    memory, out = step(
        params,
        memory,
        stream[:, s * T : (s + 1) * T],
        stream[:, s * T + 1 : (s + 1) * T + 1],
    )
    for name in ("target_logprob", "log_z", "features", "hidden"):
      np.testing.assert_allclose(
          np.asarray(getattr(out, name)),
          np.asarray(getattr(outs, name))[s],
          rtol=1e-5,
          atol=1e-5,
      )
    for got, want in zip(leaves(at(mems, s)), leaves(memory)):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for got, want in zip(leaves(final), leaves(memory)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _horizons(kind, s):
  """Last stream position each memory slot depends on after segment s
  (-1 for empty slots); see tests/models/test_recurrence.py."""
  pos = (s + 1) * T - M + np.arange(M)
  empty = pos < 0
  causal = np.where(empty, -1, pos)
  refreshed = np.where(empty, -1, np.maximum(pos, s * T))
  if kind == "xl":
    layer = recurrence.XLMemory(x=causal, valid=causal)
    return (layer, layer)
  layer = recurrence.LaMemoMemory(c=refreshed, lse=refreshed, valid=causal)
  return recurrence.XLMemory(x=causal, valid=causal), (layer, layer)


def _merge(a):
  """[S, B, T, ...] -> [B, S*T, ...]."""
  return np.asarray(recurrence.merge_segments(a))


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_causality_through_the_model_across_segments(kind):
  """Changing input tokens at positions >= t changes no feature, hidden
  state or score before t and no memory slot that depends only on
  positions < t (LaMemo's refreshed slots reach the segment's first
  token)."""
  model, params, stream, scan, _ = setup(kind)
  memory = model.init_memory(B)
  _, (outs, mems) = scan(params, memory, stream)
  for t in [1, T - 1, T, T + 2, 2 * T, S * T - 1]:
    changed = stream.copy()
    changed[:, t:] = (
        stream[:, t:] + 1 + tokens(t, stream[:, t:].shape) % (V - 1)
    ) % V
    _, (outs2, mems2) = scan(params, memory, changed)
    for name in ("features", "hidden"):
      a = _merge(getattr(outs, name))
      b = _merge(getattr(outs2, name))
      np.testing.assert_array_equal(b[:, :t], a[:, :t])
      assert np.abs(b[:, t] - a[:, t]).max() > 1e-4
    # Prediction t - 1 has target t, which changed.
    np.testing.assert_array_equal(
        _merge(outs2.target_logprob)[:, : t - 1],
        _merge(outs.target_logprob)[:, : t - 1],
    )
    for s in range(S):
      horizons = jax.tree_util.tree_leaves(_horizons(kind, s))
      before, after = leaves(at(mems, s)), leaves(at(mems2, s))
      assert len(horizons) == len(before)
      for h, a, b in zip(horizons, before, after):
        keep = h < t
        np.testing.assert_array_equal(b[:, keep], a[:, keep])


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_reset_of_one_lane_equals_a_fresh_run(kind):
  model, params, stream, _, step = setup(kind)
  lane = 2
  reset = np.zeros(B, bool)
  reset[lane] = True
  seg = lambda s: (
      stream[:, s * T : (s + 1) * T],
      stream[:, s * T + 1 : (s + 1) * T + 1],
  )
  base_outs, reset_outs = [], []
  mem_a = mem_b = model.init_memory(B)
  for s in range(S):
    if s == 1:
      mem_b = model.reset_memory(mem_b, jnp.asarray(reset))
    mem_a, out_a = step(params, mem_a, *seg(s))
    mem_b, out_b = step(params, mem_b, *seg(s))
    base_outs.append(out_a)
    reset_outs.append(out_b)
  fresh = model.init_memory(B)
  others = ~reset
  for s in range(1, S):
    fresh, out_f = step(params, fresh, *seg(s))
    for name in ("target_logprob", "hidden"):
      got = np.asarray(getattr(reset_outs[s], name))
      np.testing.assert_array_equal(
          got[others], np.asarray(getattr(base_outs[s], name))[others]
      )
      np.testing.assert_allclose(
          got[lane],
          np.asarray(getattr(out_f, name))[lane],
          rtol=1e-5,
          atol=1e-5,
      )
    assert (
        np.abs(
            np.asarray(reset_outs[s].hidden)[lane]
            - np.asarray(base_outs[s].hidden)[lane]
        ).max()
        > 1e-4
    )


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
  state, shardings = experiment.create_state(
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

  (want_loss, (_, want_outs)), grads = jax.jit(
      jax.value_and_grad(loss_fn, has_aux=True)
  )(params)
  updates, _ = tx.update(grads, tx.init(params), params)
  want_params = optax.apply_updates(params, updates)

  # The per-lane scan itself: outputs back in lane-major row order.
  got = jax.jit(
      lambda p: train_step.run_lane_segments(
          model,
          p,
          batch,
          model.init_memory(B),
          m,
          rng=jax.random.PRNGKey(0),
          deterministic=True,
      )
  )(params)
  for j in range(m):
    for name in ("features", "target_logprob"):
      np.testing.assert_allclose(
          np.asarray(getattr(got, name))[rows(j)],
          np.asarray(getattr(want_outs[j], name)),
          rtol=1e-5,
          atol=1e-5,
      )
  for g, w in zip(leaves(got.memory), leaves(loss_fn(params)[1][0])):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

  # The train step: same loss and the same update.
  assert losses_per_step[0] == pytest.approx(float(want_loss), rel=1e-5)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      history[1],
      want_params,
  )
