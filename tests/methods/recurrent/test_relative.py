"""XLAttention and DisentangledAttention against the equations (the
relative positions and rel_shift: tests/models/test_multihead.py)."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.methods.recurrent import segment_memory as rmemory
from memjax.methods.recurrent import relative
from tests.models import reference
from tests.models.helpers import apply, normal, random_params

D, H, DH = 16, 2, 4


def _memory(batch, mem_len, seed):
  rng = np.random.default_rng(seed)
  valid = np.ones((batch, mem_len), bool)
  valid[0, :2] = False  # lane 0 starts mid-memory
  x = rng.normal(size=(batch, mem_len, D)).astype(np.float32)
  x[~valid] = 0.0
  return rmemory.XLMemory(x=jnp.asarray(x), valid=jnp.asarray(valid))


@pytest.mark.newest
@pytest.mark.parametrize(
    "cls,scheme,causal",
    [
        (relative.XLAttention, "xl", True),
        (relative.DisentangledAttention, "disentangled", True),
        (relative.DisentangledAttention, "disentangled", False),
        (relative.XLAttention, "xl", False),
    ],
)
def test_segment_attention_matches_equations(cls, scheme, causal):
  """Eq. 6 (xl) / Eq. 12 (disentangled) with memory, invalid memory slots
  and the new memory; causal=False exercises the i < j direction."""
  batch, mem_len, seg_len = 2, 5, 4
  module = cls(
      d_model=D, num_heads=H, head_dim=DH, mem_len=mem_len, causal=causal
  )
  memory = _memory(batch, mem_len, 0)
  x = normal(3, (batch, seg_len, D))
  params = random_params(module, x, memory)
  y, new_memory, _ = apply(module, params, x, memory)

  p = reference.numpy_params(params)
  xs, mx = np.asarray(x, np.float64), np.asarray(memory.x, np.float64)
  valid = np.asarray(memory.valid)
  context = np.concatenate([mx, xs], axis=1)
  pos = np.arange(mem_len + seg_len)

  def visible(b, i, j):
    key_ok = j >= mem_len or valid[b, j]
    return key_ok and (not causal or j <= mem_len + i)

  c, _ = reference.relative_attention(
      p, xs, pos[mem_len:], context, pos, visible, scheme
  )
  np.testing.assert_allclose(
      np.asarray(y), reference.output_projection(p, c), rtol=2e-5, atol=2e-5
  )
  np.testing.assert_array_equal(
      np.asarray(new_memory.x), reference.last(context, mem_len)
  )
  np.testing.assert_array_equal(
      np.asarray(new_memory.valid),
      reference.last(
          np.concatenate([valid, np.ones((batch, seg_len), bool)], axis=1),
          mem_len,
      ),
  )


@pytest.mark.parametrize(
    "cls,scheme",
    [
        (relative.XLAttention, "xl"),
        (relative.DisentangledAttention, "disentangled"),
    ],
)
def test_no_memory_is_relative_position_transformer(cls, scheme):
  seg_len = 5
  module = cls(d_model=D, num_heads=H, head_dim=DH)
  x = normal(4, (2, seg_len, D))
  params = random_params(module, x, None)
  y, new_memory, _ = apply(module, params, x, None)
  assert new_memory is None
  p = reference.numpy_params(params)
  xs, pos = np.asarray(x, np.float64), np.arange(seg_len)
  c, _ = reference.relative_attention(
      p, xs, pos, xs, pos, lambda b, i, j: j <= i, scheme
  )
  np.testing.assert_allclose(
      np.asarray(y), reference.output_projection(p, c), rtol=2e-5, atol=2e-5
  )


def test_memory_longer_than_kept_and_shorter_segments():
  """mem_len smaller than the incoming memory keeps the newest slots."""
  module = relative.XLAttention(d_model=D, num_heads=H, head_dim=DH, mem_len=3)
  memory = _memory(2, 5, 1)
  x = normal(5, (2, 2, D))
  params = random_params(module, x, memory)
  _, new_memory, _ = apply(module, params, x, memory)
  want = np.concatenate([np.asarray(memory.x), np.asarray(x)], axis=1)[:, -3:]
  np.testing.assert_array_equal(np.asarray(new_memory.x), want)
  assert new_memory.valid.shape == (2, 3)


def test_parameters_have_logical_axes():
  module = relative.DisentangledAttention(d_model=D, num_heads=H, head_dim=DH)
  x = jnp.zeros((1, 3, D))
  boxed = jax.eval_shape(
      lambda: module.init(jax.random.key(0), x, None, deterministic=True)
  )
  names = jax.tree_util.tree_map(
      lambda b: b.names,
      boxed,
      is_leaf=lambda b: isinstance(b, flax.linen.LogicallyPartitioned),
  )
  p = names["params"]
  assert p["query"]["kernel"] == ("embed", "heads", "kv")
  assert p["pos_key"]["kernel"] == ("embed", "heads", "kv")
  assert p["out"]["kernel"] == ("heads", "kv", "embed")
  assert p["v_minus"] == ("heads", "kv")
