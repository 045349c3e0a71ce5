"""Multi-segment behaviour of 2-layer XL and LaMemo stacks.

Scan against a Python loop, causality across segments (including the
look-ahead path), lane resets, sharding of the carried state, bfloat16, and
the Transformer-XL equivalence of LaMemo with its switches off.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from memjax.models import recurrence
from tests.models import stack as stack_lib
from tests.models.helpers import normal, random_params

B, T, M, S, D = 8, 4, 6, 3, 16
LAMEMO_OFF = (("position", "xl"), ("look_ahead", False), ("interpolate", False))


def make_stack(kind, dtype=jnp.float32, attn_kwargs=()):
  return stack_lib.Stack(
      kind=kind, d_model=D, mem_len=M, dtype=dtype, attn_kwargs=attn_kwargs
  )


def stack_params(model, seed=0):
  return random_params(
      model,
      jnp.zeros((B, T, D), model.dtype),
      model.init_memory(B),
      seed=seed,
      scale=0.3,
  )


def scan_fn(model):
  """jit(params, memory, segments) -> (ys [S,B,T,D], memories per step)."""

  def run(params, memory, segments):
    def step(mem, seg):
      y, new_mem = model.apply(params, seg, mem)
      return new_mem, (y, new_mem)

    _, (ys, mems) = recurrence.scan_segments(step, memory, segments)
    return ys, mems

  return jax.jit(run)


@functools.lru_cache(maxsize=None)
def setup(kind):
  """(model, params, stream [B, S*T, D], jitted scan, jitted step)."""
  model = make_stack(kind)
  params = stack_params(model)
  stream = normal(1, (B, S * T, D))
  step = jax.jit(lambda p, mem, seg: model.apply(p, seg, mem))
  return model, params, stream, scan_fn(model), functools.partial(step, params)


def leaves(tree):
  return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def step_memory(mems, s):
  """The memory after segment s from scan outputs stacked on axis 0."""
  return jax.tree_util.tree_map(lambda a: a[s], mems)


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_scan_equals_python_loop(kind):
  model, params, stream, run, step = setup(kind)
  segments = recurrence.split_segments(stream, T)
  ys, mems = run(params, model.init_memory(B), segments)
  loop_ys, loop_mems = stack_lib.run_loop(step, segments, model.init_memory(B))
  np.testing.assert_allclose(
      np.asarray(ys), np.asarray(loop_ys), rtol=1e-6, atol=1e-6
  )
  for s in range(S):
    for got, want in zip(leaves(step_memory(mems, s)), leaves(loop_mems[s])):
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(
      np.asarray(recurrence.merge_segments(segments)), np.asarray(stream)
  )


def _memory_horizons(kind, s):
  """For each leaf of the memory after segment s: the last stream position
  each slot depends on (None for leaves without slots), or -1 if empty.

  A slot holds position a = (s + 1) T - M + slot. Layer inputs depend on
  tokens <= a. LaMemo's vectors c and lse were refreshed in segment s by
  look-ahead up to its first token s T: they depend on tokens
  <= max(a, s T).
  """
  pos = (s + 1) * T - M + np.arange(M)
  empty = pos < 0
  causal = np.where(empty, -1, pos)
  refreshed = np.where(empty, -1, np.maximum(pos, s * T))
  if kind == "xl":
    layer = recurrence.XLMemory(x=causal, valid=causal)
    return (layer, layer)
  layer = recurrence.LaMemoMemory(c=refreshed, lse=refreshed, valid=causal)
  return recurrence.XLMemory(x=causal, valid=causal), (layer, layer)


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_causality_across_segments(kind):
  """Perturbing tokens at positions >= t changes nothing that depends only
  on positions < t: outputs, carried memories, LaMemo's refreshed vectors
  and log-normalisers. Perturbing t itself does change the output at t,
  and (LaMemo) perturbing the first token of a segment changes the
  refreshed memory: the look-ahead reaches it, and no further."""
  model, params, stream, run, _ = setup(kind)
  memory = model.init_memory(B)
  ys, mems = run(params, memory, recurrence.split_segments(stream, T))
  ys = np.asarray(recurrence.merge_segments(ys))
  noise = np.asarray(normal(2, stream.shape))
  for t in [1, T - 1, T, T + 1, 2 * T, 2 * T + 2, S * T - 1]:
    changed = np.asarray(stream).copy()
    changed[:, t:] += noise[:, t:]
    ys2, mems2 = run(
        params, memory, recurrence.split_segments(jnp.asarray(changed), T)
    )
    ys2 = np.asarray(recurrence.merge_segments(ys2))
    np.testing.assert_array_equal(ys2[:, :t], ys[:, :t])
    assert np.abs(ys2[:, t] - ys[:, t]).max() > 1e-3
    for s in range(S):
      horizons = jax.tree_util.tree_leaves(_memory_horizons(kind, s))
      before = leaves(step_memory(mems, s))
      after = leaves(step_memory(mems2, s))
      assert len(horizons) == len(before)
      for h, a, b in zip(horizons, before, after):
        keep = h < t
        np.testing.assert_array_equal(b[:, keep], a[:, keep])
    if kind == "lamemo" and t % T == 0:
      # Segment t / T refreshed the memory with token t as a key.
      s = t // T
      pos = (s + 1) * T - M + np.arange(M)
      old = (pos >= 0) & (pos < t)  # refreshed slots, not new ones
      c_before = np.asarray(step_memory(mems, s)[1][0].c)
      c_after = np.asarray(step_memory(mems2, s)[1][0].c)
      assert old.any()
      assert (
          np.abs(c_after[:, old] - c_before[:, old]).max(axis=(0, 2, 3)) > 1e-4
      ).all()


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_reset_lane_equals_fresh_stream(kind):
  model, params, stream, _, step = setup(kind)
  segments = recurrence.split_segments(stream, T)
  lane = 1
  reset = np.zeros(B, bool)
  reset[lane] = True

  base_ys, base_mems, reset_ys, reset_mems = [], [], [], []
  mem_a = mem_b = model.init_memory(B)
  for s in range(S):
    if s == 1:
      mem_b = recurrence.reset_memory(mem_b, jnp.asarray(reset))
      # A reset lane is indistinguishable from a fresh memory.
      for got, want in zip(leaves(mem_b), leaves(model.init_memory(B))):
        np.testing.assert_array_equal(got[lane], want[lane])
    y_a, mem_a = step(mem_a, segments[s])
    y_b, mem_b = step(mem_b, segments[s])
    base_ys.append(y_a), base_mems.append(mem_a)
    reset_ys.append(y_b), reset_mems.append(mem_b)

  # A fresh stream that starts at segment 1.
  fresh_ys, fresh_mems = stack_lib.run_loop(
      step, segments[1:], model.init_memory(B)
  )
  others = ~reset
  for s in range(S):
    np.testing.assert_array_equal(
        np.asarray(reset_ys[s])[others], np.asarray(base_ys[s])[others]
    )
    for got, want in zip(leaves(reset_mems[s]), leaves(base_mems[s])):
      np.testing.assert_array_equal(got[others], want[others])
    if s >= 1:
      np.testing.assert_allclose(
          np.asarray(reset_ys[s])[lane],
          np.asarray(fresh_ys[s - 1])[lane],
          rtol=1e-6,
          atol=1e-6,
      )
      for got, want in zip(leaves(reset_mems[s]), leaves(fresh_mems[s - 1])):
        np.testing.assert_allclose(got[lane], want[lane], rtol=1e-6, atol=1e-6)
  # And a fresh (all-invalid) memory behaves like no memory at all.
  y_none, mem_none = jax.jit(lambda seg: model.apply(params, seg, None))(
      segments[1]
  )
  assert mem_none is None
  np.testing.assert_allclose(
      np.asarray(y_none)[lane],
      np.asarray(reset_ys[1])[lane],
      rtol=1e-5,
      atol=1e-5,
  )
  assert np.abs(np.asarray(y_none)[0] - np.asarray(reset_ys[1])[0]).max() > 1e-3


def test_lamemo_switched_off_equals_transformer_xl_stack():
  xl_model, params, stream, xl_run, _ = setup("xl")
  off_model = make_stack("lamemo", attn_kwargs=LAMEMO_OFF)
  assert jax.tree_util.tree_structure(
      stack_params(off_model)
  ) == jax.tree_util.tree_structure(params)
  segments = recurrence.split_segments(stream, T)
  ys_xl, _ = xl_run(params, xl_model.init_memory(B), segments)
  ys_off, _ = scan_fn(off_model)(params, off_model.init_memory(B), segments)
  np.testing.assert_allclose(
      np.asarray(ys_off), np.asarray(ys_xl), rtol=1e-5, atol=1e-5
  )
  # Switching look-ahead and interpolation back on (same parameters)
  # changes nothing in the first segment (empty memory) and everything
  # after it: the refreshed memory is read.
  on_model = make_stack("lamemo", attn_kwargs=(("position", "xl"),))
  ys_on, _ = scan_fn(on_model)(params, on_model.init_memory(B), segments)
  np.testing.assert_allclose(
      np.asarray(ys_on[0]), np.asarray(ys_xl[0]), rtol=1e-5, atol=1e-5
  )
  assert np.abs(np.asarray(ys_on[1:]) - np.asarray(ys_xl[1:])).max() > 1e-3


def test_gradient_reaches_look_ahead_and_stops_at_memory():
  """The look-ahead of layer 0 refreshes the memory rows that layer 1
  reads, so its own parameters (v_minus is used only there) get gradient;
  the last layer's refreshed rows feed nothing, and the carried memory is
  stop-gradient."""
  model, params, stream, _, step = setup("lamemo")
  segments = recurrence.split_segments(stream, T)
  _, memory = step(model.init_memory(B), segments[0])

  def loss(p, mem):
    y, _ = model.apply(p, segments[1], mem)
    return jnp.sum(y**2)

  g_params, g_mem = jax.jit(jax.grad(loss, argnums=(0, 1), allow_int=True))(
      params, memory
  )
  attn = lambda i: g_params["params"][f"block_{i}"]["attn"]
  assert np.abs(np.asarray(attn(0)["v_minus"])).max() > 0
  assert np.abs(np.asarray(attn(1)["v_minus"])).max() == 0
  for leaf in jax.tree_util.tree_leaves(g_mem):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      assert np.abs(np.asarray(leaf)).max() == 0


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_carried_state_shards_over_data_axis(kind):
  model, params, stream, run, _ = setup(kind)
  segments = recurrence.split_segments(stream, T)
  memory = model.init_memory(B)
  ys, mems = run(params, memory, segments)

  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  rules = (("batch", "data"),)
  batch_sharded = NamedSharding(mesh, P("data"))
  seg_sharding = NamedSharding(mesh, P(None, "data"))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    sharded_memory = jax.device_put(memory, batch_sharded)
    sharded_segments = jax.device_put(segments, seg_sharding)
    ys_sh, mems_sh = run(params, sharded_memory, sharded_segments)
    # The layers' logical constraints are live under the mesh and rules.
    jaxpr = str(jax.make_jaxpr(run)(params, sharded_memory, sharded_segments))
    assert "sharding_constraint" in jaxpr
  assert ys_sh.sharding.is_equivalent_to(
      NamedSharding(mesh, P(None, "data")), ys_sh.ndim
  )
  final = step_memory(mems_sh, S - 1)
  for leaf in jax.tree_util.tree_leaves(final):
    assert leaf.sharding.is_equivalent_to(batch_sharded, leaf.ndim), (
        leaf.shape,
        leaf.sharding,
    )
    assert len(leaf.addressable_shards) == 8
    assert leaf.addressable_shards[0].data.shape[0] == B // 8
  np.testing.assert_allclose(
      np.asarray(ys_sh), np.asarray(ys), rtol=1e-5, atol=1e-5
  )
  for got, want in zip(leaves(mems_sh), leaves(mems)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bfloat16_compute_with_float32_log_normalisers():
  model = make_stack("lamemo", dtype=jnp.bfloat16)
  params = stack_params(model, seed=3)
  segments = 3.0 * normal(4, (10, 2, T, D))
  memory = jax.tree_util.tree_map(lambda a: a[:2], model.init_memory(B))
  ys, mems = scan_fn(model)(params, memory, segments.astype(jnp.bfloat16))
  assert ys.dtype == jnp.bfloat16
  assert np.isfinite(np.asarray(ys, np.float32)).all()
  inputs, layers = step_memory(mems, 9)
  assert inputs.x.dtype == jnp.bfloat16
  for layer in layers:
    assert layer.c.dtype == layer.lse.dtype == jnp.float32
    assert np.isfinite(np.asarray(layer.c)).all()
    assert np.isfinite(np.asarray(layer.lse)).all()
    assert np.asarray(layer.valid).all()
