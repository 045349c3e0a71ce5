"""Tests of the continuous cache against a float64 NumPy reference."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.memory import blockwise
from memjax.methods.cache import continuous_cache as cache
from memjax.memory.visibility import MemorySpec

cache_log_prob = jax.jit(cache.cache_log_prob, static_argnames=("block_size",))
cache_log_prob_batch = jax.jit(
    cache.cache_log_prob_batch, static_argnames=("block_size",)
)


def ref_cache(q, k, k_tok, valid, tgt, lm, lam, theta, q_pos=None, k_pos=None):
  """(1 - lam) p_lm + lam p_cache for each query; p_lm alone if the cache is empty."""
  out = np.zeros(len(q))
  for i in range(len(q)):
    num = den = 0.0
    for j in range(len(k)):
      if not valid[j] or (q_pos is not None and not k_pos[j] < q_pos[i]):
        continue
      e = math.exp(theta * float(np.dot(q[i].astype(np.float64), k[j])))
      den += e
      num += e if k_tok[j] == tgt[i] else 0.0
    p_lm = math.exp(float(lm[i]))
    p = p_lm if den == 0 else (1 - lam) * p_lm + lam * num / den
    out[i] = math.log(p) if p > 0 else -np.inf
  return out


def make_memory(seed=0, q_n=6, k_n=13, d=8):
  rng = np.random.default_rng(seed)
  return dict(
      q=rng.normal(size=(q_n, d)).astype(np.float32),
      k=rng.normal(size=(k_n, d)).astype(np.float32),
      k_tok=rng.integers(0, 3, size=k_n).astype(np.int32),
      valid=rng.uniform(size=k_n) > 0.25,
      tgt=rng.integers(0, 3, size=q_n).astype(np.int32),
      lm=(-rng.uniform(0.5, 5.0, size=q_n)).astype(np.float32),
      q_pos=np.array([-1, 2, 4, 7, 11, 30])[:q_n],
      k_pos=np.arange(k_n),
  )


@pytest.mark.newest
@pytest.mark.parametrize("use_pos", [False, True])
@pytest.mark.parametrize("block_size", [None, 4])
def test_cache_matches_numpy(use_pos, block_size):
  m = make_memory()
  lam, theta = 0.3, 0.7
  bank = blockwise.KeyBank(
      m["k"], m["k_tok"], m["valid"], m["k_pos"] if use_pos else None
  )
  got = cache_log_prob(
      m["q"],
      m["tgt"],
      m["lm"],
      bank,
      lam=lam,
      theta=theta,
      query_positions=m["q_pos"] if use_pos else None,
      block_size=block_size,
  )
  want = ref_cache(
      m["q"],
      m["k"],
      m["k_tok"],
      m["valid"],
      m["tgt"],
      m["lm"],
      lam,
      theta,
      m["q_pos"] if use_pos else None,
      m["k_pos"],
  )
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  if use_pos:  # query 0 (position -1) has an empty cache: exactly p_lm
    assert np.asarray(got)[0] == m["lm"][0]


@pytest.mark.parametrize("block_size", [None, 4])
def test_lambda_zero_is_exactly_the_model(block_size):
  m = make_memory(seed=1)
  got = cache_log_prob(
      m["q"],
      m["tgt"],
      m["lm"],
      blockwise.KeyBank(m["k"], m["k_tok"], m["valid"]),
      lam=0.0,
      theta=1.0,
      block_size=block_size,
  )
  np.testing.assert_array_equal(np.asarray(got), m["lm"])


def test_batch_cache_matches_numpy_for_local_and_long_memory():
  rng = np.random.default_rng(2)
  b_size, length, d = 4, 5, 8
  f = rng.normal(size=(b_size, length, d)).astype(np.float32)
  lm = (-rng.uniform(0.5, 5.0, size=(b_size, length))).astype(np.float32)
  tgt = rng.integers(0, 3, size=(b_size, length)).astype(np.int32)
  w = np.ones((b_size, length), np.float32)
  w[3, 3:] = 0.0
  doc_id, seg = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 0])
  stream = (seg[:, None] * length + np.arange(length)[None]).reshape(-1)
  flat = lambda x: x.reshape((b_size * length,) + x.shape[2:])  # noqa: E731
  for spec, group in (
      (MemorySpec.local(), np.arange(b_size)),
      (MemorySpec.long(doc_id, seg), doc_id),
  ):
    got = np.asarray(
        cache_log_prob_batch(
            f, lm, tgt, w, spec=spec, lam=0.4, theta=0.5, block_size=3
        )
    ).reshape(-1)
    g = np.repeat(group, length)
    pos = stream if spec.mode == "long" else np.tile(np.arange(length), b_size)
    for i in np.flatnonzero(flat(w) > 0):
      # The reference cache of query i: same group, earlier, not padding.
      keep = (g == g[i]) & (flat(w) > 0)
      want = ref_cache(
          flat(f)[i : i + 1],
          flat(f)[keep],
          flat(tgt)[keep],
          np.ones(keep.sum(), bool),
          flat(tgt)[i : i + 1],
          flat(lm)[i : i + 1],
          0.4,
          0.5,
          pos[i : i + 1],
          pos[keep],
      )
      np.testing.assert_allclose(got[i], want[0], rtol=1e-5, atol=1e-6)


def test_interpolation_edges_and_gradients_are_finite():
  lm = jnp.array([-1.0, -2.0, -3.0])
  mem = jnp.array([-0.5, -jnp.inf, -4.0])
  np.testing.assert_array_equal(
      np.asarray(cache.interpolate_log_prob(lm, mem, 0.0)), lm
  )
  np.testing.assert_allclose(
      np.asarray(cache.interpolate_log_prob(lm, mem, 1.0)), mem
  )
  lm64, mem64 = np.asarray(lm, np.float64), np.asarray(mem, np.float64)
  want = np.log(0.75 * np.exp(lm64) + 0.25 * np.exp(mem64))
  got = cache.interpolate_log_prob(lm, mem, 0.25)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
  grads = jax.grad(
      lambda a, b: jnp.sum(cache.interpolate_log_prob(a, b, 0.25)),
      argnums=(0, 1),
  )(lm, mem)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
  assert float(grads[1][1]) == 0.0
