"""The continuous-cache baseline (Grave et al. 2017), for the target token.

    p(w | c) = (1 - lam) * p_lm(w | c) + lam * p_cache(w | c),
    p_cache(w | c) = sum_{i: x_i = w} exp(theta * h . h_i)
                     / sum_i exp(theta * h . h_i),

over a cache of earlier (h_i, x_i) pairs: the memory feature at position i and
the token that followed it (the same features and memory interface as the
TRIME loss). Only the target's probability is computed, in log space and
blockwise over keys, so caches of tens of thousands of entries (the paper's
long-term variant) cost O(cache) memory.

Convention: a query whose cache is empty (nothing visible) gets exactly
log p_lm, i.e. lam is applied only when p_cache is defined; lam = 0 gives
exactly log p_lm everywhere.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from memjax import errors
from memjax.memory import blockwise
from memjax.memory import evaluation
from memjax.methods.cache import config as cache_config
from memjax.memory.visibility import MemorySpec, position_meta, visible

Array = jax.Array

DEFAULT_BLOCK_SIZE = 1024


def interpolate_log_prob(
    lm_log_prob: Array, memory_log_prob: Array, lam: float | Array
) -> Array:
  """log((1 - lam) * exp(lm_log_prob) + lam * exp(memory_log_prob)).

  Args:
      lm_log_prob: [...] float, finite.
      memory_log_prob: [...] float, may be -inf (no mass on the target).
      lam: scalar in [0, 1].

  Returns:
      [...] float32; exactly lm_log_prob when lam == 0.
  """
  lm = lm_log_prob.astype(jnp.float32)
  lam = jnp.asarray(lam, jnp.float32)
  a = lm + jnp.log1p(-lam)
  # For lam = 0, b is -inf and logaddexp returns a exactly.
  log_lam = jnp.log(jnp.where(lam > 0, lam, 1.0))
  b = jnp.where(
      lam > 0, memory_log_prob.astype(jnp.float32) + log_lam, float("-inf")
  )
  return blockwise.logaddexp(a, b)


def cache_from_sums(
    lm_log_prob: Array, lse_all: Array, lse_pos: Array, lam
) -> Array:
  """log p(target) from the model and the cache's log-sum-exps.

  Args:
      lm_log_prob: [...] float32, log p_lm(target).
      lse_all: [...] float32, log sum over the visible cache entries of
          exp(theta * h . h_i); -inf where the cache is empty.
      lse_pos: [...] float32, the same over entries whose token is the target.
      lam: interpolation weight.

  Returns:
      [...] float32; exactly lm_log_prob where the cache is empty or lam = 0.
  """
  has_cache = jnp.isfinite(lse_all)
  log_p_cache = jnp.where(
      has_cache & jnp.isfinite(lse_pos),
      lse_pos - jnp.where(has_cache, lse_all, 0.0),
      float("-inf"),
  )
  mixed = interpolate_log_prob(lm_log_prob, log_p_cache, lam)
  return jnp.where(has_cache, mixed, lm_log_prob.astype(jnp.float32))


def cache_log_prob(
    queries: Array,
    targets: Array,
    lm_log_prob: Array,
    bank: blockwise.KeyBank,
    *,
    lam: float | Array,
    theta: float | Array,
    query_positions: Array | None = None,
    block_size: blockwise.BlockSize = DEFAULT_BLOCK_SIZE,
    precision: Any = None,
) -> Array:
  """log p(target) of the model interpolated with a continuous cache.

  Args:
      queries: [Q, D] float, h at the query positions.
      targets: [Q] int32.
      lm_log_prob: [Q] float32, log p_lm(target).
      bank: the cache entries (h_i [K, D], the token x_i that followed each,
          their validity and optional stream positions).
      lam: interpolation weight of the cache.
      theta: inverse temperature of the cache (multiplies h . h_i; no
          1/sqrt(d) here, as in Grave et al.).
      query_positions: optional [Q] int32 stream positions; with the bank's,
          entry j is in query i's cache only if its position is earlier.
      block_size: None for the dense path, else the (query, key) block size.
      precision: precision of the similarity matmul.

  Returns:
      [Q] float32 log p(target).
  """
  lse_all, lse_pos = blockwise.bank_logsumexp(
      queries,
      targets,
      bank,
      scale=theta,
      query_positions=query_positions,
      block_size=block_size,
      precision=precision,
  )
  return cache_from_sums(lm_log_prob, lse_all, lse_pos, lam)


def cache_log_prob_batch(
    features: Array,
    lm_log_prob: Array,
    targets: Array,
    weights: Array,
    *,
    spec: MemorySpec,
    lam: float | Array,
    theta: float | Array,
    block_size: blockwise.BlockSize = DEFAULT_BLOCK_SIZE,
    precision: Any = None,
) -> Array:
  """Continuous cache over a [B, T] batch, the cache given by a MemorySpec.

  'local' is Grave et al.'s cache over the segment; 'long' over the earlier
  segments of the same document in the batch as well (the paper's "cache
  adapted to long-term memory").

  Args:
      features: [B, T, D] float.
      lm_log_prob: [B, T] float32, log p_lm(y_t).
      targets: [B, T] int32.
      weights: [B, T] float32, 0 for padding (never a cache entry).
      spec: visibility, as for the TRIME loss.
      lam: interpolation weight.
      theta: inverse temperature.
      block_size: as in cache_log_prob.
      precision: precision of the similarity matmul.

  Returns:
      [B, T] float32 log p(y_t).
  """
  b, t, d = features.shape
  if spec.mode == "none":
    return lm_log_prob.astype(jnp.float32)
  meta = position_meta(spec, b, t)
  g = features.reshape(b * t, d)
  tgt = targets.reshape(b * t)
  lse_all, lse_pos = blockwise.memory_logsumexp(
      g,
      g,
      tgt,
      tgt,
      weights.reshape(b * t) > 0,
      scale=theta,
      query_meta=meta,
      key_meta=meta,
      visible_fn=lambda qm, km: visible(spec, qm, km),
      block_size=block_size,
      precision=precision,
  )
  return cache_from_sums(
      lm_log_prob.reshape(b * t), lse_all, lse_pos, lam
  ).reshape(b, t)


class CacheMemory(evaluation.EvalMemory):
  """The continuous cache (Grave et al.): theta scales, lambda mixes."""

  axes = (
      evaluation.Axis(
          "cache_theta",
          "thetas",
          "cache_theta_grid",
          section=cache_config.CacheEvalMemory,
      ),
      evaluation.Axis(
          "cache_lambda",
          "lambdas",
          "cache_lambda_grid",
          section=cache_config.CacheEvalMemory,
      ),
  )
  label = "continuous cache (tuned lambda, theta)"
  sweep_source_key = "cache_workdir"
  sweep_source_section = cache_config.CacheEvalMemory

  def check(self, settings: evaluation.AxisValues) -> None:
    if not settings["thetas"] or not settings["lambdas"]:
      raise errors.ConfigError(
          "cache evaluation needs at least one theta and one lambda"
      )

  def scales(self, settings: evaluation.AxisValues, dim: int) -> list[float]:
    del dim
    return list(settings["thetas"])

  def combine(
      self,
      settings: evaluation.AxisValues,
      lm: jax.Array,
      log_z: jax.Array,
      sums: Sequence[tuple[jax.Array, jax.Array]],
  ) -> jax.Array:
    del log_z
    lam = jnp.asarray(settings["lambdas"], jnp.float32)
    logp = jnp.stack(
        [
            jax.vmap(
                lambda l: cache_from_sums(lm[None], a, p, l)  # noqa: B023
            )(
                lam
            )  # [L, G, W, S]
            for a, p in sums
        ]
    )  # [N, L, G, W, S]
    return jnp.swapaxes(logp, 1, 2)
