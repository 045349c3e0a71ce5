"""The TRIME training objective with in-batch memories (Zhong et al. 2022, Eq. 5).

For a query context c with target y, memory features g and a memory of
(g_j, x_j) pairs (the feature at position j and the token that follows it):

    p(y | c) = (exp(s_y) + sum_{j visible, x_j = y} exp(sim(g_c, g_j)))
               / (Z_vocab + sum_{j visible} exp(sim(g_c, g_j))),

    sim(q, k) = q . k / (sqrt(d) * temperature).

Conventions:

* Vocabulary term. The model supplies `target_logprob` = log p_vocab(y) and
  `log_z` = the log-normaliser of its output softmax. The token term is
  exp(log_z + target_logprob) and the vocabulary normaliser is exp(log_z).
  For a full softmax this is exp(s_y) and Z_vocab exactly. For the adaptive
  softmax (Baevski & Auli 2019) we follow the authors' code: `log_z` is the
  log-normaliser of the head (logsumexp of the head logits) and the token
  term is exp(log Z_head + log p_AS(y)), where log p_AS(y) is the full
  adaptive-softmax log-probability (head plus tail cluster for rare words).
  Any log_z gives a proper combination; the head's is what the published
  models were trained with.
* Temperature divides the memory logits only (Appendix A); training uses 1.
* No memory (nothing visible, or no positive): the memory sums are exactly
  zero, so a query with nothing visible gets exactly `target_logprob`. The
  result is computed as

      log p = target_logprob + softplus(lse_pos - log_z - target_logprob)
                             - softplus(lse_all - log_z),

  which is exact in that case and has zero (not NaN) gradient into the
  empty sums.
* Padding (weight 0) positions are neither queries nor memory entries; their
  returned log-probabilities are finite but meaningless.
* Gradients flow into every memory entry's g (the paper's Table 11 shows this
  matters); `stop_gradient_memory=True` stops them on the key side only, for
  the ablation, while queries keep their gradient.

Sharding: the functions are pure jnp code; call them under jax.jit on arrays
sharded over a data axis on the batch dimension and GSPMD gathers keys and
their tokens across shards, so every query sees the memories of all shards
as the mode says, and the result equals the unsharded one.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from memjax import errors
from memjax.memory import blockwise
from memjax.memory import evaluation
from memjax.methods.trime import config as trime_config
from memjax.memory.visibility import MemorySpec, position_meta, visible

Array = jax.Array

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MemorySpec",
    "combine_log_prob",
    "log_prob_with_memory",
    "trime_log_prob",
    "trime_loss",
]

# Query and key block size of the blockwise path. A [1024, 1024] float32 tile
# is 4 MiB; the paper's largest batch (24,576 memories) is 24 x 24 tiles.
DEFAULT_BLOCK_SIZE = 1024


def combine_log_prob(
    target_logprob: Array, log_z: Array, lse_all: Array, lse_pos: Array
) -> Array:
  """Combines the vocabulary term and the memory sums into log p(y | c).

  Args:
      target_logprob: [...] float, log p_vocab(y).
      log_z: [...] float, log-normaliser of the vocabulary softmax.
      lse_all: [...] float32, log of the sum over visible memories, -inf if
          none.
      lse_pos: [...] float32, log of the sum over visible memories whose
          token is y, -inf if none.

  Returns:
      [...] float32 log p(y | c); exactly target_logprob where lse_all is
      -inf.
  """
  tlp = target_logprob.astype(jnp.float32)
  lz = log_z.astype(jnp.float32)
  return (
      tlp
      + blockwise.softplus(lse_pos - (lz + tlp))
      - blockwise.softplus(lse_all - lz)
  )


def _causal(query_positions: Array, key_positions: Array) -> Array:
  """[Q, K] bool: key strictly earlier than query."""
  return key_positions[None, :] < query_positions[:, None]


def _memory_terms(
    features: Array,
    target_logprob: Array,
    log_z: Array,
    targets: Array,
    weights: Array,
    spec: MemorySpec,
    temperature: float | Array,
    stop_gradient_memory: bool,
    block_size: blockwise.BlockSize,
    precision: Any,
) -> tuple[Array, Array, Array]:
  """Returns (log p [B,T], lse_all [B,T], lse_pos [B,T]), all float32."""
  _check_shapes(features, target_logprob, log_z, targets, weights)
  b, t, d = features.shape
  valid = weights.reshape(b * t) > 0
  # Padded queries get harmless inputs so nothing there can turn into NaN.
  mask = weights > 0
  tlp = jnp.where(mask, target_logprob.astype(jnp.float32), 0.0)
  lz = jnp.where(mask, log_z.astype(jnp.float32), 0.0)
  if spec.mode == "none":
    empty = jnp.full((b, t), float("-inf"), jnp.float32)
    return target_logprob.astype(jnp.float32), empty, empty
  keys = jax.lax.stop_gradient(features) if stop_gradient_memory else features
  scale = 1.0 / (math.sqrt(d) * jnp.asarray(temperature, jnp.float32))
  sums = functools.partial(
      blockwise.memory_logsumexp,
      scale=scale,
      block_size=block_size,
      precision=precision,
  )
  if spec.mode == "local" and block_size is not None:
    # Rows never see each other's entries: score each row against its own
    # keys only (B tiles of [T, T] work instead of one [N, N]). vmap keeps
    # the batch axis, so a batch sharded over rows stays sharded.
    pos = jnp.arange(t, dtype=jnp.int32)

    def one_row(q, k, tgt, val):
      return sums(
          q,
          k,
          tgt,
          tgt,
          val,
          query_meta=pos,
          key_meta=pos,
          visible_fn=_causal,
      )

    lse_all, lse_pos = jax.vmap(one_row)(
        features, keys, targets, valid.reshape(b, t)
    )
    return combine_log_prob(tlp, lz, lse_all, lse_pos), lse_all, lse_pos

  meta = position_meta(spec, b, t)
  tgt = targets.reshape(b * t)
  lse_all, lse_pos = sums(
      features.reshape(b * t, d),
      keys.reshape(b * t, d),
      tgt,
      tgt,
      valid,
      query_meta=meta,
      key_meta=meta,
      visible_fn=lambda qm, km: visible(spec, qm, km),
  )
  lse_all = lse_all.reshape(b, t)
  lse_pos = lse_pos.reshape(b, t)
  return combine_log_prob(tlp, lz, lse_all, lse_pos), lse_all, lse_pos


def _check_shapes(
    features: Array,
    target_logprob: Array,
    log_z: Array,
    targets: Array,
    weights: Array,
) -> None:
  """Raises ValueError unless features is [B, T, D] and the rest [B, T]."""
  if features.ndim != 3:
    raise ValueError(f"features must be [B, T, D]; got shape {features.shape}.")
  b, t, _ = features.shape
  for name, x in (
      ("target_logprob", target_logprob),
      ("log_z", log_z),
      ("targets", targets),
      ("weights", weights),
  ):
    if x.shape != (b, t):
      raise ValueError(
          f"{name} must have shape [B, T]=({b}, {t}); got {x.shape}."
      )


def trime_log_prob(
    features: Array,
    target_logprob: Array,
    log_z: Array,
    targets: Array,
    weights: Array,
    *,
    spec: MemorySpec,
    temperature: float | Array = 1.0,
    stop_gradient_memory: bool = False,
    block_size: blockwise.BlockSize = DEFAULT_BLOCK_SIZE,
    precision: Any = None,
) -> Array:
  """log p(y_t | c_t) under Eq. 5 with the in-batch memory given by `spec`.

  Args:
      features: [B, T, D] any float dtype, the memory features g (the input
          of the last feed-forward block after its LayerNorm).
      target_logprob: [B, T] float32, log p_vocab(y_t) from the (adaptive)
          softmax.
      log_z: [B, T] float32, log-normaliser of the vocabulary softmax (the
          head's for the adaptive softmax; see the module docstring).
      targets: [B, T] int32, y_t; also the token of memory entry t.
      weights: [B, T] float32, 0 for padding.
      spec: which entries each query sees (see visibility.MemorySpec).
      temperature: divides the memory logits only (1 in training).
      stop_gradient_memory: stop the gradient on the key side (ablation).
      block_size: None for the dense [N, N] reference path, else the query
          and key block size (int or pair) of the blockwise path.
      precision: precision of the similarity matmul.

  Returns:
      [B, T] float32 log-probabilities of the targets.
  """
  logp, _, _ = _memory_terms(
      features,
      target_logprob,
      log_z,
      targets,
      weights,
      spec,
      temperature,
      stop_gradient_memory,
      block_size,
      precision,
  )
  return logp


def trime_loss(
    features: Array,
    target_logprob: Array,
    log_z: Array,
    targets: Array,
    weights: Array,
    *,
    spec: MemorySpec,
    temperature: float | Array = 1.0,
    stop_gradient_memory: bool = False,
    block_size: blockwise.BlockSize = DEFAULT_BLOCK_SIZE,
    precision: Any = None,
) -> tuple[Array, dict[str, Array]]:
  """Mean TRIME negative log-likelihood over weighted positions.

  Args: as trime_log_prob.

  Returns:
      (loss, aux): loss is the scalar float32 sum(w * nll) / sum(w) (0 if
      every weight is 0). aux holds float32 scalars:
        'loss': the same value;
        'lm_loss': the plain cross-entropy -target_logprob, same weighting
          (what the model would pay without memory; the paper trains on it
          for the first 5% of updates, e.g. with spec=MemorySpec.none());
        'num_tokens': sum of weights;
        'frac_with_memory': share of weighted queries with a visible memory;
        'frac_with_positive': share with a visible entry of their target;
        'memory_target_share': mean share of the target's probability that
          comes from memory entries rather than the vocabulary term.
  """
  logp, lse_all, lse_pos = _memory_terms(
      features,
      target_logprob,
      log_z,
      targets,
      weights,
      spec,
      temperature,
      stop_gradient_memory,
      block_size,
      precision,
  )
  w = weights.astype(jnp.float32)
  mask = w > 0
  total = jnp.sum(w)
  denom = jnp.where(total > 0, total, 1.0)

  def wmean(x):
    return jnp.sum(jnp.where(mask, w * x.astype(jnp.float32), 0.0)) / denom

  loss = wmean(-logp)
  tlp = jnp.where(mask, target_logprob.astype(jnp.float32), 0.0)
  lz = jnp.where(mask, log_z.astype(jnp.float32), 0.0)
  # p_mem(y) / p(y) = exp(lse_pos - log(exp(token) + exp(lse_pos))).
  token = lz + tlp
  share = jnp.exp(lse_pos - blockwise.logaddexp(token, lse_pos))
  aux = {
      "loss": loss,
      "lm_loss": wmean(-tlp),
      "num_tokens": total,
      "frac_with_memory": jax.lax.stop_gradient(wmean(jnp.isfinite(lse_all))),
      "frac_with_positive": jax.lax.stop_gradient(wmean(jnp.isfinite(lse_pos))),
      "memory_target_share": jax.lax.stop_gradient(wmean(share)),
  }
  return loss, aux


def log_prob_with_memory(
    queries: Array,
    targets: Array,
    target_logprob: Array,
    log_z: Array,
    bank: blockwise.KeyBank,
    *,
    query_positions: Array | None = None,
    temperature: float | Array = 1.0,
    block_size: blockwise.BlockSize = DEFAULT_BLOCK_SIZE,
    precision: Any = None,
) -> Array:
  """Eq. 6 over an explicit memory (e.g. a long-term memory bank).

  The evaluation with long-term memories keeps (g, token) pairs across
  windows of a document stream and calls this with those keys rather than
  the batch's. Only the memory logits are divided by `temperature`.

  Args:
      queries: [Q, D] float, g of the query positions.
      targets: [Q] int32.
      target_logprob: [Q] float32, log p_vocab(target).
      log_z: [Q] float32, log-normaliser of the vocabulary softmax.
      bank: the memory entries (g [K, D], the token that followed each,
          their validity and optional stream positions).
      query_positions: optional [Q] int32 stream positions; with the bank's,
          entry j is visible to query i only if its position is earlier (so
          the current window can be passed with the bank, causally).
      temperature: divides the memory logits (tuned on the dev set).
      block_size: as in trime_log_prob.
      precision: precision of the similarity matmul.

  Returns:
      [Q] float32 log p(target).
  """
  d = queries.shape[-1]
  lse_all, lse_pos = blockwise.bank_logsumexp(
      queries,
      targets,
      bank,
      scale=1.0 / (math.sqrt(d) * jnp.asarray(temperature, jnp.float32)),
      query_positions=query_positions,
      block_size=block_size,
      precision=precision,
  )
  return combine_log_prob(target_logprob, log_z, lse_all, lse_pos)


class TrimeMemory(evaluation.EvalMemory):
  """TRIME's testing memories (Eq. 6), tau dividing the memory logits."""

  axes = (
      evaluation.Axis(
          "temperature",
          "temperatures",
          "temperature_grid",
          (1.0,),
          section=trime_config.Trime,
      ),
  )
  label = "TRIME (Eq. 6, tuned tau)"

  def check(self, settings: evaluation.AxisValues) -> None:
    if not settings["temperatures"]:
      raise errors.ConfigError(
          "trime evaluation needs at least one temperature"
      )

  def scales(self, settings: evaluation.AxisValues, dim: int) -> list[float]:
    return [1.0 / (math.sqrt(dim) * tau) for tau in settings["temperatures"]]

  def combine(
      self,
      settings: evaluation.AxisValues,
      lm: jax.Array,
      log_z: jax.Array,
      sums: Sequence[tuple[jax.Array, jax.Array]],
  ) -> jax.Array:
    return jnp.stack(
        [combine_log_prob(lm[None], log_z[None], a, p) for a, p in sums]
    )  # [N, G, W, S]
