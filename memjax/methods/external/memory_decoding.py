"""Decoding with an external memory, inside beam search's hook.

Each decoding step's g [N, D] is sent to the host (``jax.pure_callback``),
where the datastore (``mt_datastore``) returns its K nearest (g_j, y_j)
with exact scores; the step's log-probabilities are then combined with
them on the device. Three ways (``mt_memory``):

* ``knn`` (kNN-MT, Khandelwal et al. 2021): p = lam p_kNN + (1 - lam) p_MT,
  p_kNN(v) = sum_{j: y_j = v} softmax_j(-||g - g_j||^2 / T) over the K
  neighbours by squared L2 (defaults k = 32, lam = 0.2, T = 100).
* ``trime`` (TRIMEMT_ext): the neighbours by inner product join the
  vocabulary softmax (Eq. 6),
      p(v) = (exp(s_v) + sum_{j: y_j = v} exp(m_j)) / (Z + sum_j exp(m_j)),
      m_j = g . g_j / (sqrt(d) tau),
  i.e. p = lam p_mem + (1 - lam) p_MT with lam = exp(lse(m) - lse(s, m)),
  the memory mass, and p_mem = softmax(m) summed per token.
* ``trime`` with ``unnormalised``: the authors' code, which takes the same
  lam (princeton-nlp/TRIME ``machine_translation/fairseq/models/
  transformer.py`` 940-946) but returns (1 - lam) p_MT + p_mem (line 1235,
  ``knn_lambda_type`` 'trime'), without the factor lam on p_mem: the
  scores sum to 2 - lam over the vocabulary, not 1.
* ``trime`` with ``interpolate``: the same memory distribution softmax(m)
  mixed with a tuned lam instead of the mass.

The same combinations, applied to the target token only, score teacher-
forced positions (``target_log_probs``) to tune K, lam and the temperature
on valid.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from memjax import errors
from memjax.memory import blockwise
from memjax.memory import generation
from memjax.methods.trime import in_batch as trime

Array = jax.Array

KINDS = ("none", "knn", "trime")


def metric_of(kind: str) -> str:
  """The search metric of a memory kind."""
  return "squared_l2" if kind == "knn" else "dot_product"


def vocab_sums(logits: Array, values: Array, vocab_size: int):
  """(lse_all [N], lse_v [N, V]): log sum of exp(memory logits) over all
  neighbours and over those whose token is v (-inf where none).

  Args:
    logits: [N, K] memory logits, -inf for no neighbour.
    values: [N, K] int their tokens.
    vocab_size: V.
  """
  valid = jnp.isfinite(logits)
  lse_v = generation.token_logsumexp(logits, values, valid, vocab_size)
  return blockwise.masked_logsumexp(logits, valid), lse_v


def target_sums(logits: Array, values: Array, targets: Array):
  """(lse_all [...], lse_pos [...]) of memory logits [..., K] for the
  target token only."""
  valid = jnp.isfinite(logits)
  pos = valid & (values == targets[..., None])
  return blockwise.masked_logsumexp(logits, valid), blockwise.masked_logsumexp(
      logits, pos
  )


def interpolate(logp: Array, lse_all: Array, lse_pos: Array, lam) -> Array:
  """log((1 - lam) p + lam p_mem), p_mem = exp(lse_pos - lse_all); ``logp``
  unchanged where the memory is empty (or lam = 0)."""
  lam = jnp.asarray(lam, jnp.float32)
  mem = lse_pos - jnp.where(jnp.isfinite(lse_all), lse_all, 0.0)
  mem = jnp.where(jnp.isfinite(lse_all), mem, -jnp.inf)
  mixed = jnp.logaddexp(jnp.log1p(-lam) + logp, jnp.log(lam) + mem)
  return jnp.where(jnp.isfinite(lse_all) & (lam > 0), mixed, logp)


def combine(
    kind: str,
    settings: dict[str, Any],
    logp: Array,
    log_z: Array,
    lse_all: Array,
    lse_pos: Array,
) -> Array:
  """log p under the memory ``kind`` from the memory sums (scores already
  scaled); ``logp`` and ``lse_pos`` [N, V] (or [...] for targets),
  ``log_z`` and ``lse_all`` broadcastable to them."""
  if kind == "knn" or settings.get("interpolate"):
    lam = settings["knn_lambda"] if kind == "knn" else settings["lambda"]
    return interpolate(logp, lse_all, lse_pos, lam)
  if settings.get("unnormalised"):
    return unnormalised(logp, log_z, lse_all, lse_pos)
  # Joint softmax (Eq. 6): exactly logp where the memory is empty.
  return trime.combine_log_prob(logp, log_z, lse_all, lse_pos)


def unnormalised(logp: Array, log_z: Array, lse_all: Array, lse_pos: Array):
  """log((1 - lam) p_MT + p_mem), lam the memory mass (the authors'
  ``transformer.py`` 1235); ``logp`` where the memory is empty."""
  has = jnp.isfinite(lse_all)
  all_ = jnp.where(has, lse_all, 0.0)
  lz = jnp.broadcast_to(log_z, jnp.broadcast_shapes(log_z.shape, all_.shape))
  mt = logp + lz - blockwise.logaddexp(lz, all_)  # log (1 - lam) p_MT
  mem = jnp.where(has, lse_pos - all_, -jnp.inf)  # log p_mem
  return jnp.where(has, blockwise.logaddexp(mt, mem), logp)


def scale_of(kind: str, settings: dict[str, Any], dim: int) -> float:
  """What multiplies the raw scores (-L2 or g . g_j) into memory logits."""
  if kind == "knn":
    return 1.0 / float(settings["knn_temperature"])
  return 1.0 / (math.sqrt(dim) * float(settings["temperature"]))


class MemoryHook:
  """A ``decoding.LogProbHook`` that mixes in the external memory.

  Attributes:
    kind: 'knn' or 'trime'.
    settings: knn_lambda / knn_temperature, or temperature, interpolate,
      lambda, unnormalised.
    neighbours: host function ``g [N, D] -> (scores [N, K], values [N, K])``
      (``mt_datastore.Neighbours``).
    k: K.
    dim: D.
    takes_log_z: the joint softmax needs the vocabulary's log-normaliser.
  """

  def __init__(self, kind: str, settings: dict[str, Any], neighbours, k, dim):
    if kind not in ("knn", "trime"):
      raise errors.ConfigError(
          f"mt_memory.kind must be one of {KINDS}, got {kind!r}"
      )
    self.kind, self.settings = kind, dict(settings)
    self.neighbours, self.k, self.dim = neighbours, int(k), int(dim)
    self.takes_log_z = kind == "trime"

  def search(self, g: Array) -> tuple[Array, Array]:
    """The neighbours of g [N, D] from the host: scores, values [N, K]."""
    shapes = (
        jax.ShapeDtypeStruct((g.shape[0], self.k), jnp.float32),
        jax.ShapeDtypeStruct((g.shape[0], self.k), jnp.int32),
    )
    return jax.pure_callback(
        self.neighbours,
        shapes,
        g.astype(jnp.float32),
        vmap_method="sequential",
    )

  def __call__(self, logp, g, step, log_z=None):
    del step
    scores, values = self.search(g)
    logits = scores * scale_of(self.kind, self.settings, self.dim)
    lse_all, lse_v = vocab_sums(logits, values, logp.shape[-1])
    if log_z is None:
      log_z = jnp.zeros(logp.shape[:-1], jnp.float32)
    return combine(
        self.kind, self.settings, logp, log_z[:, None], lse_all[:, None], lse_v
    )


def target_log_probs(
    kind: str,
    settings: dict[str, Any],
    tlp: Array,
    log_z: Array,
    scores: Array,
    values: Array,
    targets: Array,
    dim: int,
) -> Array:
  """Teacher-forced log p(target) [Q] under a memory setting.

  Args:
    kind: 'knn' or 'trime'.
    settings: as ``MemoryHook``'s.
    tlp: [Q] log p_MT(target).
    log_z: [Q] the vocabulary's log-normaliser.
    scores: [Q, K] raw neighbour scores (-inf for none).
    values: [Q, K] their tokens.
    targets: [Q].
    dim: D.
  """
  logits = scores * scale_of(kind, settings, dim)
  lse_all, lse_pos = target_sums(logits, values, targets)
  return combine(kind, settings, tlp, log_z, lse_all, lse_pos)


def memory_share(lse_all: Array, log_z: Array) -> Array:
  """The memory mass lam = exp(lse(m) - logaddexp(log Z, lse(m)))."""
  return jnp.exp(lse_all - blockwise.logaddexp(log_z, lse_all))
