"""memjax.models.multihead: the one attention core against NumPy.

The paths built on the core are tested against their own equations
elsewhere (test_attention: the causal LM attention; recurrent/test_relative
and test_lamemo: the relative kinds; marge/test_model: MARGE's biased
cross-attention); here the core's general forms: grouped key/value heads
with a padding mask and an added bias, a query with no key to read, a
cross-attention from keys computed once, decoding step by step from a
cache, and each layout's parameters.
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.models import multihead

B, T, S, D, H, DH = 2, 5, 6, 16, 4, 8


def _np_attention(p, x, y, mask, bias, kv_heads):
  """float64 attention of x [B, T, D] over y [B, S, D]: mask [B, T, S]
  (True = may attend), bias [B, T, S]; a row with no key gives zeros."""
  f = lambda a: np.asarray(a, np.float64)  # noqa: E731
  x, y = f(x), f(y)
  q = np.einsum("btd,dhk->bthk", x, f(p["query"]))
  k = np.einsum("bsd,dhk->bshk", y, f(p["key"]))
  v = np.einsum("bsd,dhk->bshk", y, f(p["value"]))
  group = H // kv_heads
  out = np.zeros((x.shape[0], x.shape[1], D))
  for b in range(x.shape[0]):
    for h in range(H):
      for i in range(x.shape[1]):
        keys = np.flatnonzero(mask[b, i])
        if not keys.size:
          continue
        s = k[b, keys, h // group] @ q[b, i, h] / np.sqrt(DH) + bias[b, i, keys]
        w = np.exp(s - s.max())
        w /= w.sum()
        out[b, i] += (w @ v[b, keys, h // group]) @ f(p["out"])[h]
  return out


def _init(layer, x, **kwargs):
  return flax.core.meta.unbox(
      jax.jit(lambda k: layer.init(k, x, deterministic=True, **kwargs))(
          jax.random.PRNGKey(0)
      )["params"]
  )


def test_grouped_heads_a_padding_mask_a_bias_and_an_empty_row():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, T, D)).astype(np.float32)
  y = rng.normal(size=(B, S, D)).astype(np.float32)
  mask = rng.random((B, T, S)) < 0.6
  mask[1, 2] = False  # This query may read no key: its output is 0.
  bias = rng.normal(size=(B, T, S)).astype(np.float32)
  layer = multihead.MultiHeadAttention(
      d_model=D, num_heads=H, head_dim=DH, num_kv_heads=2
  )
  params = _init(layer, x)
  assert params["key"].shape == (D, 2, DH)  # Grouped: 2 key/value heads.

  def cross(p):
    def f(m):
      return m(
          x,
          deterministic=True,
          kv=m.kv(jnp.asarray(y)),
          mask=jnp.asarray(mask)[:, None],
          bias=jnp.asarray(bias)[:, None],
      )[0]

    return layer.apply({"params": p}, method=f)

  got = np.asarray(jax.jit(cross)(params))
  want = _np_attention(params, x, y, mask, bias, 2)
  np.testing.assert_allclose(got, want, atol=2e-5)
  assert not got[1, 2].any()


def test_a_decoder_fed_one_token_at_a_time_from_its_cache_equals_its_full_pass():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(B, T, D)).astype(np.float32))
  layer = multihead.MultiHeadAttention(d_model=D, num_heads=H, head_dim=DH)
  params = _init(layer, x)
  full, _ = layer.apply({"params": params}, x, deterministic=True, causal=True)

  @jax.jit
  def step(cache, token, pos):
    t = jnp.arange(T)
    mask = (t <= pos)[None, None, None, :]
    return layer.apply(
        {"params": params},
        token,
        cache,
        deterministic=True,
        mask=mask,
        pos=pos,
    )

  cache = (jnp.zeros((B, T, H, DH)), jnp.zeros((B, T, H, DH)))
  outs = []
  for pos in range(T):
    y, cache = step(cache, x[:, pos : pos + 1], jnp.int32(pos))
    outs.append(y)
  np.testing.assert_allclose(
      np.concatenate(outs, axis=1), np.asarray(full), atol=1e-5
  )


@pytest.mark.parametrize(
    "kwargs,names",
    [
        ({}, {"query", "key", "value", "out"}),
        (
            {"qkv_bias": True, "out_bias": True},
            {
                "query",
                "key",
                "value",
                "out",
                "query_bias",
                "key_bias",
                "value_bias",
                "out_bias",
            },
        ),
        (
            {"projections": "module", "relative": "xl"},
            {"query", "key", "value", "pos_key", "out", "u", "v"},
        ),
        (
            {"projections": "module", "relative": "disentangled"},
            {
                "query",
                "key",
                "value",
                "pos_key",
                "out",
                "u",
                "v_plus",
                "v_minus",
            },
        ),
    ],
)
def test_each_layout_names_its_parameters(kwargs, names):
  x = jnp.zeros((1, 3, D))
  layer = multihead.MultiHeadAttention(
      d_model=D, num_heads=H, head_dim=DH, **kwargs
  )

  def use(m):
    q, k, v = (m.project(x, n) for n in ("query", "key", "value"))
    c, _, _ = m.attend(m.scores(q, k, delta_top=2), True, v, True)
    return m.output(c)

  params = layer.init(jax.random.PRNGKey(0), method=use)["params"]
  assert set(params) == names
