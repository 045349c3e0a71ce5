"""LaMemoAttention: interpolation, one layer against the paper, switches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.methods.recurrent import lamemo
from memjax.methods.recurrent import segment_memory as rmemory
from memjax.methods.recurrent import relative
from tests.models import reference
from tests.models.helpers import apply as _apply
from tests.models.helpers import normal
from tests.models.helpers import random_params

D, H, DH = 16, 2, 4


def _lamemo_memory(batch, mem_len, seed, invalid=2):
  rng = np.random.default_rng(seed)
  valid = np.ones((batch, mem_len), bool)
  valid[0, :invalid] = False
  c = rng.normal(size=(batch, mem_len, H, DH))
  lse = rng.normal(size=(batch, mem_len, H)) + 1.0
  c[~valid], lse[~valid] = 0.0, 0.0
  return rmemory.LaMemoMemory(
      c=jnp.asarray(c, jnp.float32),
      lse=jnp.asarray(lse, jnp.float32),
      valid=jnp.asarray(valid),
  )


@pytest.mark.parametrize("eps", [1e-6, 0.05])
def test_interpolation_matches_eq_10_11(eps):
  rng = np.random.default_rng(0)
  c_old, c_new = rng.normal(size=(2, 3, 5, H, DH))
  d_old, d_new = 2.0 * rng.normal(size=(2, 3, 5, H))
  c, lse, alpha = jax.jit(lamemo.interpolate_memory)(
      *(jnp.asarray(a, jnp.float32) for a in (c_old, d_old, c_new, d_new)),
      eps=eps,
  )
  want_c, want_lse, want_alpha = reference.interpolate(
      c_old, d_old, c_new, d_new, eps
  )
  np.testing.assert_allclose(
      np.asarray(alpha), want_alpha, rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(np.asarray(c), want_c, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-5, atol=1e-5)
  assert c.dtype == lse.dtype == alpha.dtype == jnp.float32


def test_interpolation_is_stable_for_large_log_normalisers():
  """exp(d) overflows float32 above ~88; the max-subtracted form must not."""
  d_old = np.array([[300.0, 650.0, -400.0, 10.0]])
  d_new = np.array([[301.0, 640.0, -399.0, 700.0]])
  c_old = np.ones((1, 4, DH))
  c_new = -np.ones((1, 4, DH))
  c, lse, alpha = jax.jit(lamemo.interpolate_memory)(
      jnp.asarray(c_old[:, :, None], jnp.float32),
      jnp.asarray(d_old[..., None], jnp.float32),
      jnp.asarray(c_new[:, :, None], jnp.float32),
      jnp.asarray(d_new[..., None], jnp.float32),
      eps=0.0,
  )
  want_alpha = 1.0 / (1.0 + np.exp(d_new - d_old))  # float64, no overflow
  np.testing.assert_allclose(
      np.asarray(alpha)[..., 0], want_alpha, rtol=1e-5, atol=1e-30
  )
  np.testing.assert_allclose(
      np.asarray(lse)[..., 0], np.logaddexp(d_old, d_new), rtol=1e-6
  )
  assert np.isfinite(np.asarray(c)).all()
  # No old vector (lse_old = -inf): alpha is exactly 0, lse is lse_new.
  c, lse, alpha = jax.jit(lamemo.interpolate_memory)(
      jnp.ones((1, H, DH)),
      jnp.full((1, H), -jnp.inf),
      jnp.zeros((1, H, DH)),
      jnp.full((1, H), 3.0),
  )
  assert float(jnp.max(alpha)) == 0.0
  np.testing.assert_array_equal(np.asarray(lse), 3.0)
  np.testing.assert_array_equal(np.asarray(c), 0.0)


def test_look_ahead_window_tiles_the_stream():
  """Eq. 7: keys are the last N-1 memory tokens and the first current one;
  successive segments' windows cover each position once."""
  assert lamemo.look_ahead_window(6, 4) == (3, 4)  # rows 3, 4, 5 | 6
  assert lamemo.look_ahead_window(3, 5) == (1, 3)  # M < T: rows 1, 2 | 3
  assert lamemo.look_ahead_window(4, 1) == (4, 1)  # only the first token
  mem_len, seg_len = 6, 4
  start, width = lamemo.look_ahead_window(mem_len, seg_len)
  covered = []
  for s in range(1, 5):  # segment s starts at absolute position s * T
    first_abs = s * seg_len - mem_len  # absolute position of row 0
    covered += [first_abs + r for r in range(start, start + width)]
  assert covered == list(range(seg_len - mem_len + start, 4 * seg_len + 1))


@pytest.mark.newest
@pytest.mark.parametrize(
    "scheme,mem_len,seg_len,new_len",
    [
        ("disentangled", 5, 3, 5),
        ("xl", 5, 3, 5),
        ("disentangled", 3, 5, 4),  # M < T, and fewer slots kept than given
        ("xl", 4, 4, 4),
    ],
)
def test_lamemo_layer_matches_paper(scheme, mem_len, seg_len, new_len):
  batch, eps = 2, 1e-6
  module = lamemo.LaMemoAttention(
      d_model=D,
      num_heads=H,
      head_dim=DH,
      mem_len=new_len,
      options=lamemo.LaMemoOptions(position=scheme, eps=eps),
  )
  memory = _lamemo_memory(batch, mem_len, 1)
  x = normal(2, (batch, mem_len + seg_len, D))
  params = random_params(module, x, memory)
  y, new_memory, inter = _apply(module, params, x, memory)

  want = reference.lamemo_layer(
      reference.numpy_params(params),
      np.asarray(x, np.float64),
      np.asarray(memory.c, np.float64),
      np.asarray(memory.lse, np.float64),
      np.asarray(memory.valid),
      scheme,
      eps,
      new_len,
  )
  tol = dict(rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(y), want["y"], **tol)
  np.testing.assert_allclose(
      np.asarray(inter["alpha"][0]), want["alpha"], **tol
  )
  np.testing.assert_allclose(np.asarray(new_memory.c), want["c"], **tol)
  np.testing.assert_allclose(np.asarray(new_memory.lse), want["lse"], **tol)
  np.testing.assert_array_equal(np.asarray(new_memory.valid), want["valid"])
  assert new_memory.c.dtype == new_memory.lse.dtype == jnp.float32
  # The analysis outputs have the documented shapes.
  width = min(mem_len, seg_len)
  assert inter["attention_probs"][0].shape == (
      batch,
      H,
      seg_len,
      mem_len + seg_len,
  )
  assert inter["look_ahead_probs"][0].shape == (batch, H, mem_len, width)
  np.testing.assert_allclose(
      np.asarray(inter["look_ahead_probs"][0]).sum(-1), 1.0, rtol=1e-5
  )


def test_without_interpolation_memory_is_look_ahead_only():
  mem_len, seg_len = 5, 3
  module = lamemo.LaMemoAttention(
      d_model=D,
      num_heads=H,
      head_dim=DH,
      mem_len=mem_len,
      options=lamemo.LaMemoOptions(interpolate=False),
  )
  memory = _lamemo_memory(2, mem_len, 3)
  x = normal(4, (2, mem_len + seg_len, D))
  params = random_params(module, x, memory)
  y, new_memory, inter = _apply(module, params, x, memory)
  want = reference.lamemo_layer(
      reference.numpy_params(params),
      np.asarray(x, np.float64),
      np.asarray(memory.c, np.float64),
      np.asarray(memory.lse, np.float64),
      np.asarray(memory.valid),
      "disentangled",
      1e-6,
      mem_len,
      interpolate_memory=False,
  )
  np.testing.assert_allclose(np.asarray(y), want["y"], rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(
      np.asarray(new_memory.c), want["c"], rtol=2e-5, atol=2e-5
  )
  assert float(jnp.max(jnp.abs(inter["alpha"][0]))) == 0.0


def test_without_look_ahead_memory_is_not_refreshed():
  mem_len, seg_len = 5, 3
  module = lamemo.LaMemoAttention(
      d_model=D,
      num_heads=H,
      head_dim=DH,
      mem_len=mem_len,
      options=lamemo.LaMemoOptions(look_ahead=False),
  )
  memory = _lamemo_memory(2, mem_len, 5)
  x = normal(6, (2, mem_len + seg_len, D))
  params = random_params(module, x, memory)
  y, new_memory, inter = _apply(module, params, x, memory)
  assert "alpha" not in inter and "look_ahead_probs" not in inter
  p = reference.numpy_params(params)
  # Memory rows output W_o C_old; the kept old slots are C_old unchanged.
  np.testing.assert_allclose(
      np.asarray(y[:, :mem_len]),
      reference.output_projection(p, np.asarray(memory.c, np.float64)),
      rtol=2e-5,
      atol=2e-5,
  )
  np.testing.assert_array_equal(
      np.asarray(new_memory.c[:, :2]), np.asarray(memory.c[:, 3:])
  )
  np.testing.assert_array_equal(
      np.asarray(new_memory.lse[:, :2]), np.asarray(memory.lse[:, 3:])
  )


def test_lamemo_switched_off_equals_transformer_xl_layer():
  """look_ahead=False, interpolate=False, position='xl': same parameter
  tree as XLAttention and the same segment outputs."""
  batch, mem_len, seg_len = 2, 5, 3
  xl = relative.XLAttention(
      d_model=D, num_heads=H, head_dim=DH, mem_len=mem_len
  )
  lm = lamemo.LaMemoAttention(
      d_model=D,
      num_heads=H,
      head_dim=DH,
      mem_len=mem_len,
      options=lamemo.LaMemoOptions(
          position="xl", look_ahead=False, interpolate=False
      ),
  )
  rng = np.random.default_rng(7)
  valid = np.ones((batch, mem_len), bool)
  valid[1, :3] = False
  mem_x = rng.normal(size=(batch, mem_len, D)).astype(np.float32)
  mem_x[~valid] = 0.0
  x = rng.normal(size=(batch, seg_len, D)).astype(np.float32)
  xl_memory = rmemory.XLMemory(x=jnp.asarray(mem_x), valid=jnp.asarray(valid))
  params = random_params(xl, jnp.asarray(x), xl_memory)
  lm_memory = _lamemo_memory(batch, mem_len, 8)
  lm_memory = lm_memory.replace(valid=jnp.asarray(valid))
  lm_x = jnp.asarray(np.concatenate([mem_x, x], axis=1))
  lm_params = random_params(lm, lm_x, lm_memory)
  assert jax.tree_util.tree_structure(
      lm_params
  ) == jax.tree_util.tree_structure(params)
  assert jax.tree_util.tree_map(jnp.shape, lm_params) == jax.tree_util.tree_map(
      jnp.shape, params
  )

  y_xl, _, _ = _apply(xl, params, jnp.asarray(x), xl_memory)
  y_lm, _, _ = _apply(lm, params, lm_x, lm_memory)
  np.testing.assert_allclose(
      np.asarray(y_lm[:, mem_len:]), np.asarray(y_xl), rtol=1e-6, atol=1e-6
  )


def test_no_memory_and_empty_memory_equal_disentangled_attention():
  seg_len, mem_len = 4, 3
  module = lamemo.LaMemoAttention(
      d_model=D, num_heads=H, head_dim=DH, mem_len=mem_len
  )
  dis = relative.DisentangledAttention(d_model=D, num_heads=H, head_dim=DH)
  x = normal(9, (2, seg_len, D))
  params = random_params(dis, x, None)
  y_dis, _, _ = _apply(dis, params, x, None)
  y, new_memory, _ = _apply(module, params, x, None)
  assert new_memory is None
  np.testing.assert_allclose(
      np.asarray(y), np.asarray(y_dis), rtol=1e-6, atol=1e-6
  )
  # An all-invalid memory (garbage rows) behaves like no memory.
  empty = module.init_memory(2)
  rows = normal(10, (2, mem_len, D))
  y_empty, new_memory, _ = _apply(
      module, params, np.concatenate([rows, x], axis=1), empty
  )
  np.testing.assert_allclose(
      np.asarray(y_empty[:, mem_len:]), np.asarray(y_dis), rtol=1e-6, atol=1e-6
  )
  np.testing.assert_array_equal(np.asarray(y_empty[:, :mem_len]), 0.0)
  np.testing.assert_array_equal(np.asarray(new_memory.valid), True)


def test_rejects_input_without_segment_rows():
  module = lamemo.LaMemoAttention(
      d_model=D, num_heads=H, head_dim=DH, mem_len=4
  )
  with pytest.raises(ValueError, match="memory rows"):
    module.init(
        jax.random.key(0),
        jnp.zeros((1, 4, D)),
        module.init_memory(1),
        deterministic=True,
    )
