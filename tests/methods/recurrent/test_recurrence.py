"""Multi-segment behaviour of ``TransformerLM`` with carried memory.

For attention 'xl' and 'lamemo': a ``jax.lax.scan`` over segments against a
Python loop, causality across segments (including LaMemo's look-ahead path),
lane resets, the Transformer-XL equivalence of LaMemo with its switches off,
gradients through the look-ahead, bfloat16 compute, and a run sharded over 8
fake devices against the single-device run.
"""

import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax import sharding as sharding_lib
from memjax.models import recurrence
from memjax.methods.recurrent import segment_memory as rmemory
from memjax.models import transformer
from tests.models import helpers

V, B, T, M, S = 50, 8, 4, 6, 3
OUTPUTS = ("target_logprob", "log_z", "features", "hidden")
BF16_TOL = 0.15  # absolute; outputs are O(1) to O(10)
LAMEMO_OFF = (("position", "xl"), ("look_ahead", False), ("interpolate", False))


def make_model(
    kind: str, dtype: str = "float32", options: tuple = ()
) -> transformer.TransformerLM:
  """A 2-layer ``TransformerLM``; ``options`` are (name, value) pairs."""
  return transformer.TransformerLM(
      cfg=helpers.tiny(
          V,
          num_layers=2,
          attention_options=dict(options),
          mem_len=M,
          dtype=dtype,
          attention=kind,
      )
  )


def tokens(seed: int, shape: tuple[int, ...]) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, V, shape).astype(np.int32)


def random_params(
    model: transformer.TransformerLM, seed: int = 0, scale: float = 0.3
) -> dict:
  """Every parameter drawn at random (LayerNorm scales around 1), so that
  every term matters, the position biases included. Nothing is compiled."""
  x = jnp.zeros((1, T), jnp.int32)
  shapes = flax.core.meta.unbox(
      jax.eval_shape(lambda: model.init(jax.random.key(0), x, x))
  )["params"]
  rng = np.random.default_rng(seed)

  def draw(path, s):
    base = 1.0 if path[-1].key == "scale" else 0.0
    return jnp.asarray(base + scale * rng.normal(size=s.shape), s.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def scan_fn(model: transformer.TransformerLM) -> Callable:
  """jit(params, memory, stream [B, S*T + 1]) -> (final memory, (outputs
  [S, B, T(, D)] without memory, memories after each segment [S, ...]))."""

  def run(params, memory, stream):
    segments = recurrence.split_segments(
        {"inputs": stream[:, :-1], "targets": stream[:, 1:]}, T
    )

    def step(mem, seg):
      out = model.apply(
          {"params": params}, seg["inputs"], seg["targets"], memory=mem
      )
      return out.memory, (out.replace(memory=None), out.memory)

    return recurrence.scan_segments(step, memory, segments)

  return jax.jit(run)


def step_fn(model: transformer.TransformerLM) -> Callable:
  """jit(params, memory, inputs [B, T], targets [B, T]) -> LMOutput."""
  return jax.jit(
      lambda p, mem, x, y: model.apply({"params": p}, x, y, memory=mem)
  )


def segment(stream: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
  """(inputs, targets) [B, T] of segment s of a [B, S*T + 1] stream."""
  return stream[:, s * T : (s + 1) * T], stream[:, s * T + 1 : (s + 1) * T + 1]


@functools.lru_cache(maxsize=None)
def setup(kind: str) -> tuple:
  """(model, params, stream [B, S*T + 1], jitted scan, jitted step)."""
  model = make_model(kind)
  return (
      model,
      random_params(model),
      tokens(0, (B, S * T + 1)),
      scan_fn(model),
      step_fn(model),
  )


def leaves(tree: Any) -> list[np.ndarray]:
  return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def at(tree: Any, s: int) -> Any:
  """Entry s of a pytree stacked on axis 0."""
  return jax.tree_util.tree_map(lambda a: a[s], tree)


def merged(outs: transformer.LMOutput, name: str) -> np.ndarray:
  """Output ``name`` of a scan, [S, B, T(, D)] -> [B, S*T(, D)]."""
  return np.asarray(recurrence.merge_segments(getattr(outs, name)))


def assert_trees_close(got: Any, want: Any, tol: float) -> None:
  for g, w in zip(leaves(got), leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_scan_equals_python_loop(kind: str) -> None:
  model, params, stream, scan, step = setup(kind)
  final, (outs, mems) = scan(params, model.init_memory(B), stream)
  memory = model.init_memory(B)
  for s in range(S):
    out = step(params, memory, *segment(stream, s))
    memory = out.memory
    for name in OUTPUTS:
      np.testing.assert_allclose(
          np.asarray(getattr(outs, name))[s],
          np.asarray(getattr(out, name)),
          rtol=1e-5,
          atol=1e-5,
      )
    assert_trees_close(at(mems, s), memory, 1e-5)
  assert_trees_close(final, memory, 1e-5)
  inputs = stream[:, :-1]
  np.testing.assert_array_equal(
      recurrence.merge_segments(recurrence.split_segments(inputs, T)), inputs
  )


def _memory_horizons(kind: str, s: int) -> Any:
  """For each leaf of the memory after segment s: the last stream position
  each slot depends on, or -1 for an empty slot.

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
    layer = rmemory.XLMemory(x=causal, valid=causal)
    return (layer, layer)
  layer = rmemory.LaMemoMemory(c=refreshed, lse=refreshed, valid=causal)
  return rmemory.XLMemory(x=causal, valid=causal), (layer, layer)


def _check_look_ahead_reached(mems: Any, mems2: Any, t: int) -> None:
  """Segment s = t / T refreshed the old memory slots of every LaMemo
  layer with token t (its first) as a key, so all of them changed."""
  s = t // T
  pos = (s + 1) * T - M + np.arange(M)
  old = (pos >= 0) & (pos < t)  # refreshed slots, not the new ones
  assert old.any()
  for before, after in zip(at(mems, s)[1], at(mems2, s)[1], strict=True):
    diff = np.abs(np.asarray(after.c) - np.asarray(before.c))
    assert (diff[:, old].max(axis=(0, 2, 3)) > 1e-4).all()


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_causality_across_segments(kind: str) -> None:
  """Changing the tokens at positions >= t (a later segment when t is a
  segment start) changes no output before t and no memory slot that
  depends only on positions < t; it does change the outputs at t, and
  (LaMemo, t a segment start) the refreshed memory: the look-ahead reaches
  the segment's first token and no further."""
  model, params, stream, scan, _ = setup(kind)
  memory = model.init_memory(B)
  _, (outs, mems) = scan(params, memory, stream)
  for t in [1, T - 1, T, T + 1, T + 2, 2 * T, 2 * T + 1, S * T - 1]:
    changed = stream.copy()
    changed[:, t:] = (stream[:, t:] + 1 + tokens(t, (B, S * T + 1 - t))) % V
    _, (outs2, mems2) = scan(params, memory, changed)
    for name in ("features", "hidden", "log_z"):
      a, b = merged(outs, name), merged(outs2, name)
      np.testing.assert_array_equal(b[:, :t], a[:, :t])
      assert np.abs(b[:, t] - a[:, t]).max() > 1e-4
    # Prediction t - 1 has target t, which changed.
    np.testing.assert_array_equal(
        merged(outs2, "target_logprob")[:, : t - 1],
        merged(outs, "target_logprob")[:, : t - 1],
    )
    for s in range(S):
      horizons = jax.tree_util.tree_leaves(_memory_horizons(kind, s))
      before, after = leaves(at(mems, s)), leaves(at(mems2, s))
      assert len(horizons) == len(before)
      for h, a, b in zip(horizons, before, after):
        keep = h < t
        np.testing.assert_array_equal(b[:, keep], a[:, keep])
    if kind == "lamemo" and t % T == 0:
      _check_look_ahead_reached(mems, mems2, t)


def _check_reset_memory(
    model: transformer.TransformerLM, memory: Any, reset: np.ndarray
) -> Any:
  """``reset_memory`` empties exactly the lanes where ``reset`` is set."""
  got = model.reset_memory(memory, jnp.asarray(reset))
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(
      memory
  )
  for g, old, empty in zip(
      leaves(got), leaves(memory), leaves(model.init_memory(B)), strict=True
  ):
    assert g.dtype == old.dtype
    np.testing.assert_array_equal(g[reset], empty[reset])
    np.testing.assert_array_equal(g[~reset], old[~reset])
    assert old[reset].any()  # the reset lanes were not empty before
  return got


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_reset_lane_equals_fresh_stream(kind: str) -> None:
  """After a reset before segment 1, the reset lanes run as a stream that
  starts at segment 1 (from an empty memory, and as with no memory at
  all); the other lanes are untouched."""
  model, params, stream, _, step = setup(kind)
  reset = np.zeros(B, bool)
  reset[[1, 6]] = True
  others = ~reset
  base, after_reset = [], []
  mem_a = mem_b = model.init_memory(B)
  for s in range(S):
    if s == 1:
      mem_b = _check_reset_memory(model, mem_b, reset)
    base.append(step(params, mem_a, *segment(stream, s)))
    after_reset.append(step(params, mem_b, *segment(stream, s)))
    mem_a, mem_b = base[-1].memory, after_reset[-1].memory

  fresh = model.init_memory(B)
  for s in range(1, S):
    out_f = step(params, fresh, *segment(stream, s))
    fresh = out_f.memory
    got, want = after_reset[s], base[s]
    for name in OUTPUTS:
      g = np.asarray(getattr(got, name))
      np.testing.assert_array_equal(
          g[others], np.asarray(getattr(want, name))[others]
      )
      np.testing.assert_allclose(
          g[reset], np.asarray(getattr(out_f, name))[reset], atol=1e-5
      )
    for g, w, f in zip(leaves(got.memory), leaves(want.memory), leaves(fresh)):
      np.testing.assert_array_equal(g[others], w[others])
      np.testing.assert_allclose(g[reset], f[reset], atol=1e-5)
    diff = np.asarray(got.hidden)[reset] - np.asarray(want.hidden)[reset]
    assert np.abs(diff).max() > 1e-4
  # An empty memory behaves like no memory at all.
  none = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y, memory=None))(
      params, *segment(stream, 1)
  )
  assert none.memory is None
  for name in OUTPUTS:
    np.testing.assert_allclose(
        np.asarray(getattr(none, name))[reset],
        np.asarray(getattr(after_reset[1], name))[reset],
        atol=1e-5,
    )


def test_lamemo_switched_off_equals_transformer_xl() -> None:
  """LaMemo without look-ahead and interpolation, with XL positions, is
  Transformer-XL with the same parameters (the parameter trees match);
  switching the look-ahead back on changes nothing in the first segment
  (empty memory) and every later one."""
  xl_model, params, stream, xl_scan, _ = setup("xl")
  off_model = make_model("lamemo", options=LAMEMO_OFF)
  assert jax.tree_util.tree_structure(
      random_params(off_model)
  ) == jax.tree_util.tree_structure(params)
  _, (xl_outs, _) = xl_scan(params, xl_model.init_memory(B), stream)
  _, (off_outs, _) = scan_fn(off_model)(
      params, off_model.init_memory(B), stream
  )
  for name in OUTPUTS:
    np.testing.assert_allclose(
        np.asarray(getattr(off_outs, name)),
        np.asarray(getattr(xl_outs, name)),
        rtol=1e-5,
        atol=1e-5,
    )
  on_model = make_model("lamemo", options=(("position", "xl"),))
  _, (on_outs, _) = scan_fn(on_model)(params, on_model.init_memory(B), stream)
  on, xl = np.asarray(on_outs.hidden), np.asarray(xl_outs.hidden)
  np.testing.assert_allclose(on[0], xl[0], rtol=1e-5, atol=1e-5)
  for s in range(1, S):
    assert np.abs(on[s] - xl[s]).max() > 1e-3


def test_gradient_reaches_look_ahead_and_stops_at_memory() -> None:
  """The look-ahead of layer 0 refreshes the memory rows that layer 1
  reads, so its v_minus (used only by the look-ahead) gets gradient; the
  last layer's refreshed rows feed no output, and the carried memory is
  stop-gradient."""
  model, params, stream, _, step = setup("lamemo")
  memory = step(params, model.init_memory(B), *segment(stream, 0)).memory

  def loss(p, mem):
    out = model.apply({"params": p}, *segment(stream, 1), memory=mem)
    return -jnp.sum(out.target_logprob) + jnp.sum(out.hidden**2)

  g_params, g_mem = jax.jit(jax.grad(loss, argnums=(0, 1), allow_int=True))(
      params, memory
  )
  minus = lambda i: np.asarray(g_params[f"layer_{i}"]["attention"]["v_minus"])
  assert np.abs(minus(0)).max() > 0
  assert np.abs(minus(1)).max() == 0
  for leaf in jax.tree_util.tree_leaves(g_mem):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      assert np.abs(np.asarray(leaf)).max() == 0


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_bfloat16_runs_many_segments_close_to_float32(kind: str) -> None:
  """bfloat16 compute over 8 segments stays finite and close to float32
  with the same (float32) parameters; the carried inputs are bfloat16,
  LaMemo's c and lse stay float32."""
  model, params, _, _, step = setup(kind)
  bf16 = make_model(kind, dtype="bfloat16")
  bf16_step = step_fn(bf16)
  stream = tokens(4, (B, 8 * T + 1))
  memory, want_memory = bf16.init_memory(B), model.init_memory(B)
  for s in range(8):
    out = bf16_step(params, memory, *segment(stream, s))
    want = step(params, want_memory, *segment(stream, s))
    memory, want_memory = out.memory, want.memory
    assert out.hidden.dtype == jnp.bfloat16
    assert out.target_logprob.dtype == jnp.float32
    for name in OUTPUTS:
      got = np.asarray(getattr(out, name), np.float32)
      assert np.isfinite(got).all()
      np.testing.assert_allclose(
          got, np.asarray(getattr(want, name)), rtol=0, atol=BF16_TOL
      )
  assert memory[0].x.dtype == jnp.bfloat16
  for layer in memory if kind == "xl" else memory[1]:
    assert np.asarray(layer.valid).all()
    if kind == "lamemo":
      assert layer.c.dtype == layer.lse.dtype == jnp.float32
      assert np.isfinite(np.asarray(layer.c)).all()
      assert np.isfinite(np.asarray(layer.lse)).all()


def _put_on_mesh(
    model: transformer.TransformerLM,
    mesh: jax.sharding.Mesh,
    params: dict,
    memory: Any,
    stream: np.ndarray,
) -> tuple[dict, Any, jax.Array]:
  """Parameters by their logical axes, memory and stream by batch."""
  x = jnp.zeros((1, T), jnp.int32)
  with flax.linen.logical_axis_rules(sharding_lib.LOGICAL_RULES):
    logical = flax.linen.get_partition_spec(
        jax.eval_shape(lambda: model.init(jax.random.key(0), x, x))
    )["params"]
  shardings = sharding_lib.logical_sharding(mesh, logical)
  memory = jax.tree_util.tree_map(
      lambda a: jax.device_put(a, sharding_lib.batch_sharding(mesh, a.ndim)),
      memory,
  )
  return (
      jax.device_put(params, shardings),
      memory,
      sharding_lib.put_global_batch({"s": stream}, mesh)["s"],
  )


@pytest.mark.parametrize("kind", ["xl", "lamemo"])
def test_sharded_run_equals_single_device(kind: str) -> None:
  """The jitted segment scan on a (data 4, tensor 2) mesh of 8 devices,
  with the batch and the carried memory split over data and parameters
  over tensor, equals the single-device run."""
  assert len(jax.devices()) == 8
  model, params, stream, scan, _ = setup(kind)
  final, (outs, mems) = scan(params, model.init_memory(B), stream)
  mesh = sharding_lib.make_mesh({"data": 4, "tensor": 2})
  args = _put_on_mesh(model, mesh, params, model.init_memory(B), stream)
  kernel = args[0]["layer_0"]["ffn"]["wi"]["kernel"]
  assert kernel.addressable_shards[0].data.shape == (16, 16)
  run = scan_fn(model)
  with sharding_lib.mesh_rules(mesh):
    final_sh, (outs_sh, mems_sh) = run(*args)
    # The layers' logical constraints are live under the mesh and rules.
    assert "sharding_constraint" in str(jax.make_jaxpr(run)(*args))
  for leaf in jax.tree_util.tree_leaves(final_sh):
    assert len(leaf.sharding.device_set) == 8
    assert leaf.addressable_shards[0].data.shape[0] == B // 4
  assert outs_sh.hidden.addressable_shards[0].data.shape[1] == B // 4
  assert_trees_close(final_sh, final, 1e-5)
  assert_trees_close(mems_sh, mems, 1e-5)
  for name in OUTPUTS:
    np.testing.assert_allclose(
        np.asarray(getattr(outs_sh, name)),
        np.asarray(getattr(outs, name)),
        rtol=1e-5,
        atol=1e-5,
    )
