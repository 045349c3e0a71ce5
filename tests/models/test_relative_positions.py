"""memjax.models.relative_positions: the sinusoid encodings of relative
distances and Transformer-XL's relative shift, against their definitions;
the absolute sinusoid table (``block_stack.sinusoid_table``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.models import block_stack
from memjax.models import relative_positions
from tests.models import reference


def test_sinusoid_positions_match_reference():
  dist = np.array([-3.0, 0.0, 1.0, 7.5, 40.0])
  got = relative_positions.sinusoid_positions(jnp.asarray(dist), 10)
  want = np.stack([reference.sinusoid(p, 10) for p in dist])
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_len,p_len", [(4, 4), (3, 7), (5, 9), (1, 3)])
def test_rel_shift_matches_definition(q_len, p_len):
  x = np.arange(q_len * p_len, dtype=np.float32).reshape(q_len, p_len) + 1
  got = np.asarray(relative_positions.rel_shift(jnp.asarray(x)))
  want = reference.rel_shift(x)
  defined = ~np.isnan(want)
  # Every entry with j <= i + P - Q is defined and must match.
  for i in range(q_len):
    assert defined[i, : i + p_len - q_len + 1].all()
  np.testing.assert_array_equal(got[defined], want[defined])
  # Batched leading axes shift every matrix the same way.
  xb = np.stack([x, 2 * x])[:, None]
  gotb = np.asarray(relative_positions.rel_shift(jnp.asarray(xb)))
  np.testing.assert_array_equal(gotb[1, 0][defined], 2 * want[defined])


def test_the_absolute_table_is_vaswanis():
  table = block_stack.sinusoid_table(6, 8)
  pos, i = np.arange(6)[:, None], np.arange(4)[None]
  angle = pos / 10000 ** (2 * i / 8)
  np.testing.assert_allclose(table[:, 0::2], np.sin(angle), atol=1e-6)
  np.testing.assert_allclose(table[:, 1::2], np.cos(angle), atol=1e-6)


@pytest.mark.parametrize(
    "dtype,atol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)]
)
def test_narrow_softmax_is_masked_softmax_with_its_gradient(dtype, atol):
  key = jax.random.PRNGKey(0)
  scores = jax.random.normal(key, (2, 3, 5, 7))
  mask = jnp.tril(jnp.ones((5, 7), bool), 2)[None, None]
  w = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 5, 7))
  u = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 5))

  def loss(fn):
    def f(s):
      probs, lse = fn(s)
      return jnp.sum(probs.astype(jnp.float32) * w) + jnp.sum(lse * u)

    return f

  want = relative_positions.masked_softmax(scores, mask)
  got = relative_positions.narrow_softmax(scores, mask, dtype)
  assert got[0].dtype == dtype and got[1].dtype == jnp.float32
  np.testing.assert_allclose(got[0].astype(jnp.float32), want[0], atol=atol)
  np.testing.assert_allclose(got[1], want[1], atol=1e-6)
  g_want = jax.grad(loss(lambda s: relative_positions.masked_softmax(s, mask)))
  g_got = jax.grad(
      loss(lambda s: relative_positions.narrow_softmax(s, mask, dtype))
  )
  np.testing.assert_allclose(g_got(scores), g_want(scores), atol=atol)
