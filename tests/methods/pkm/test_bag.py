"""The memory-bounded read against a NumPy reference of its formula and
gradients, and against the plain gather inside the layer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.methods.pkm import bag
from memjax.methods.pkm import layer as pkm


def np_read(values, slots, weights):
  """out[n] = sum_j w[n, j] V[s[n, j]], one position at a time."""
  out = np.zeros(slots.shape[:-1] + (values.shape[1],))
  for n in np.ndindex(*slots.shape[:-1]):
    for j in range(slots.shape[-1]):
      out[n] += weights[n + (j,)] * values[slots[n + (j,)]]
  return out


def np_read_grads(values, slots, weights, g):
  """Gradients of sum(out * g): dV[s] += w g (repeats add up), dw = g . V[s]."""
  dv = np.zeros_like(values, dtype=np.float64)
  dw = np.zeros(weights.shape)
  for n in np.ndindex(*slots.shape[:-1]):
    for j in range(slots.shape[-1]):
      dv[slots[n + (j,)]] += weights[n + (j,)] * g[n]
      dw[n + (j,)] = g[n] @ values[slots[n + (j,)]]
  return dv, dw


def _case():
  rng = np.random.default_rng(0)
  values = rng.normal(size=(7, 5)).astype(np.float32)
  slots = rng.integers(0, 7, (2, 3, 6))
  slots[0, 0] = [4, 4, 4, 1, 4, 1]  # Repeats within a position.
  slots[1, 2] = slots[0, 0]  # And across positions and rows.
  weights = rng.normal(size=(2, 3, 6)).astype(np.float32)
  g = rng.normal(size=(2, 3, 5)).astype(np.float32)
  return values, slots, weights, g


@pytest.mark.parametrize("group", [0, 1, 2, 3, 6])
def test_read_and_gradients_match_numpy(group):
  values, slots, weights, g = _case()
  out, vjp = jax.vjp(
      lambda v, w: bag.read(v, jnp.asarray(slots), w, group), values, weights
  )
  np.testing.assert_allclose(
      out, np_read(values, slots, weights), rtol=1e-6, atol=1e-6
  )
  dv, dw = vjp(jnp.asarray(g))
  ref_dv, ref_dw = np_read_grads(values, slots, weights, g)
  np.testing.assert_allclose(dv, ref_dv, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(dw, ref_dw, rtol=1e-6, atol=1e-6)


def test_group_must_divide_the_columns():
  values, slots, weights, _ = _case()
  with pytest.raises(ValueError, match="must divide"):
    bag.read(values, slots, weights, 4)


def test_no_gathered_rows_are_held():
  """XLA's own accounting: the bag's forward and backward hold far less
  than one [..., J, V] array of gathered rows; the plain gather holds
  more than it."""
  slots = jax.random.randint(jax.random.PRNGKey(0), (4, 256, 64), 0, 4096)
  weights = jax.random.normal(jax.random.PRNGKey(1), (4, 256, 64))
  values = jnp.zeros((4096, 64))
  rows_bytes = 4 * 256 * 64 * 64 * 4

  def temp(read):
    loss = lambda v, w: jnp.sum(read(v, slots, w) ** 2)
    step = jax.jit(jax.grad(loss, (0, 1)))
    return step.lower(values, weights).compile().memory_analysis()

  gathered = temp(bag.gather_read).temp_size_in_bytes
  bagged = temp(lambda v, s, w: bag.read(v, s, w, 2)).temp_size_in_bytes
  assert gathered >= rows_bytes
  assert bagged <= rows_bytes / 4, (bagged, rows_bytes)


def test_layer_gradients_equal_the_gather_read():
  """Through the whole layer (queries, keys, values; padding; repeated
  slots from a small table), the bag and the gather agree in float32."""
  args = dict(num_keys=4, heads=2, topk=3, k_dim=8)
  memory = lambda **kw: pkm.ProductKeyMemory(
      d_model=12, options=pkm.MemoryOptions(**args, **kw)
  )
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 12))
  mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  target = jax.random.normal(jax.random.PRNGKey(2), (2, 5, 12))
  variables = memory().init(jax.random.PRNGKey(0), x, deterministic=True)

  def grads(read):
    layer = memory(read=read)

    def loss(params, x):
      out = layer.apply({"params": params}, x, deterministic=True, mask=mask)
      return jnp.sum(out * target)

    return jax.grad(loss, (0, 1))(variables["params"], x)

  bagged, gathered = grads("bag"), grads("gather")
  for a, b in zip(jax.tree.leaves(bagged), jax.tree.leaves(gathered)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  dvalues = nn.meta.unbox(bagged[0])["values"]
  assert np.count_nonzero(np.any(np.asarray(dvalues) != 0, -1)) > 1
  assert np.all(np.asarray(bagged[1])[0, 3:] == 0)  # Padding: no gradient.
