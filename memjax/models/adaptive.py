"""Adaptive input embeddings and adaptive softmax (Baevski & Auli, 2019).

The vocabulary, sorted by descending frequency, is cut into clusters at
``cutoffs``. Cluster ``i`` has an embedding table of dimension
``d_model // factor**i`` and a projection to ``d_model``. The output layer
reuses both (tied weights and tied projections): the head scores the tokens of
cluster 0 plus one logit per tail cluster, and each tail cluster has its own
softmax over its tokens.

With ``cutoffs=()`` the module is an ordinary tied embedding and softmax, which
is what byte-level models (enwik8, text8) use.

Log-normaliser convention (it matters for the TRIME loss): ``log_z`` is the
log-normaliser of the head softmax, and ``target_logprob`` the full adaptive
log-probability of the target, so ``log_z + target_logprob`` plays the role of
the target's logit. With one cluster this is exactly the plain softmax's
``logsumexp(logits)`` and ``logits[y]``.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors
from memjax.models import stack

Array = jax.Array


@jax.custom_vjp
def narrow_log_softmax_stats(
    logits: Array, index: Array
) -> tuple[Array, Array, Array]:
  """A softmax's statistics in float32 from logits in a narrow dtype.

  The normaliser and the mean are reduced in float32 without keeping a
  float32 copy of the logits, and the backward pass forms the logits'
  gradient in float32 arithmetic but writes it in the logits' dtype: no
  [..., V] float32 buffer in either pass. (Written by hand because the
  autodiff of ``log_softmax`` keeps its float32 output, then a float32
  gradient of the same size.)

  Args:
    logits: [..., V] logits in the compute dtype.
    index: [...] int positions in [0, V) (the targets).

  Returns:
    (log p(index), log-normaliser, mean over V of log p), each [...]
    float32.
  """
  return _log_softmax_stats(logits, index)


def _log_softmax_stats(logits: Array, index: Array) -> tuple[Array, ...]:
  x = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(x, axis=-1)
  picked = jnp.take_along_axis(logits, index[..., None], axis=-1)[..., 0]
  return picked.astype(jnp.float32) - lse, lse, jnp.mean(x, axis=-1) - lse


def _stats_fwd(logits, index):
  out = _log_softmax_stats(logits, index)
  return out, (logits, index, out[1])


def _stats_bwd(saved, grads):
  logits, index, lse = saved
  g_target, g_lse, g_mean = (g[..., None] for g in grads)
  probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
  onehot = index[..., None] == jnp.arange(logits.shape[-1])
  # d log p_i = onehot - p; d lse = p; d mean log p = 1 / V - p.
  d = (
      g_target * onehot.astype(jnp.float32)
      + (g_lse - g_target - g_mean) * probs
      + g_mean / logits.shape[-1]
  )
  return d.astype(logits.dtype), None


narrow_log_softmax_stats.defvjp(_stats_fwd, _stats_bwd)


def chunk_layout(rows: int, positions: int, chunk_size: int) -> tuple[int, int]:
  """(positions per chunk, chunks) the adaptive softmax scores a row in.

  A chunk holds at most ``chunk_size`` tokens over the ``rows`` (at least
  one position of each). The positions are spread evenly over the fewest
  chunks that hold them, so a chunk carries at most one padded position:
  150 positions of 64 rows at 4096 tokens are 3 chunks of 50, not of 64
  padded to 192. One chunk (no padding) when they all fit.

  Args:
    rows: the leading (batch) size scored together.
    positions: positions per row.
    chunk_size: tokens scored at a time (``model.softmax_chunk``).
  """
  most = max(1, chunk_size // max(rows, 1))
  if positions <= most:
    return positions, 1
  chunks = -(-positions // most)
  return -(-positions // chunks), chunks


def cluster_bounds(
    vocab_size: int, cutoffs: Sequence[int]
) -> list[tuple[int, int]]:
  """Returns the [start, end) token range of each cluster.

  Args:
    vocab_size: V, the number of tokens.
    cutoffs: increasing cluster boundaries strictly inside (0, V).

  Raises:
    ValueError: if the cut-offs are not increasing or fall outside (0, V).
  """
  cuts = list(cutoffs)
  if cuts and (
      sorted(set(cuts)) != cuts or cuts[0] <= 0 or cuts[-1] >= vocab_size
  ):
    raise errors.ConfigError(
        f"adaptive cutoffs {cuts} must increase strictly inside (0, "
        f"{vocab_size}); set model.cutoffs to fit the vocabulary"
    )
  edges = [0] + cuts + [vocab_size]
  return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


class AdaptiveEmbed(nn.Module):
  """Tied adaptive input embedding and adaptive softmax.

  Attributes:
    vocab_size: V.
    d_model: D, the model width.
    cutoffs: cluster boundaries (empty: one cluster, a plain softmax).
    factor: each cluster's embedding dimension is D // factor**i.
    scale: multiply input embeddings by sqrt(D) (fairseq's embed_scale).
    chunk_size: tokens scored at a time (all rows, a slice of positions of
      each); bounds the [B, chunk, V_i] logits kept alive instead of
      [B, T, V_i].
    tail_dropout: dropout on each tail cluster's projected input, between
      its projection and its output embedding, in training only (fairseq's
      ``adaptive_softmax_dropout``; 0.2 in transformer_lm_wiki103). The head
      has none, as in fairseq.
    dtype: compute dtype of the projections; log-probabilities are float32.
    tied: the softmax reuses the input embeddings; False (a plain softmax
      only): its own [V, D] table ``output``, as untied Llama-family models.
  """

  vocab_size: int
  d_model: int
  cutoffs: Sequence[int] = ()
  factor: int = 4
  scale: bool = False
  chunk_size: int = 4096
  tail_dropout: float = 0.0
  dtype: jnp.dtype = jnp.float32
  tied: bool = True

  def setup(self):
    self.bounds = cluster_bounds(self.vocab_size, self.cutoffs)
    if not self.tied and len(self.bounds) > 1:
      raise errors.ConfigError(
          "model.family_options.tie_embeddings False takes a plain softmax: "
          "set model.cutoffs to ()"
      )
    self.output = None
    if not self.tied:
      self.output = self.param(
          "output",
          nn.with_logical_partitioning(
              nn.initializers.normal(stddev=self.d_model**-0.5),
              ("vocab", "embed"),
          ),
          (self.vocab_size, self.d_model),
      )
    tables, projs = [], []
    for i, (lo, hi) in enumerate(self.bounds):
      dim = max(1, self.d_model // (self.factor**i))
      tables.append(
          self.param(
              f"embed_{i}",
              nn.with_logical_partitioning(
                  nn.initializers.normal(stddev=dim**-0.5), ("vocab", "embed")
              ),
              (hi - lo, dim),
          )
      )
      if len(self.bounds) > 1:
        projs.append(
            self.param(
                f"proj_{i}",
                nn.with_logical_partitioning(
                    nn.initializers.xavier_uniform(), (None, "embed")
                ),
                (dim, self.d_model),
            )
        )
    self.tables = tables
    self.projs = projs
    self.dropout = nn.Dropout(self.tail_dropout)
    if len(self.bounds) > 1:
      self.cluster_weight = self.param(
          "cluster_weight",
          nn.with_logical_partitioning(nn.initializers.zeros, ("embed", None)),
          (self.d_model, len(self.bounds) - 1),
      )

  def _project_in(self, i: int, e: Array) -> Array:
    if not self.projs:
      return e
    return jnp.dot(e.astype(self.dtype), self.projs[i].astype(self.dtype))

  def _project_out(self, i: int, h: Array) -> Array:
    if not self.projs:
      return h
    return jnp.dot(h.astype(self.dtype), self.projs[i].astype(self.dtype).T)

  def embed(self, ids: Array) -> Array:
    """Embeds token ids.

    Args:
      ids: [...] int token ids.

    Returns:
      [..., D] embeddings in the compute dtype.
    """
    out = jnp.zeros(ids.shape + (self.d_model,), self.dtype)
    for i, (lo, hi) in enumerate(self.bounds):
      in_cluster = (ids >= lo) & (ids < hi)
      local = jnp.clip(ids - lo, 0, hi - lo - 1)
      e = self._project_in(i, jnp.take(self.tables[i], local, axis=0))
      out = out + jnp.where(in_cluster[..., None], e.astype(self.dtype), 0)
    if self.scale:
      out = out * jnp.sqrt(jnp.asarray(self.d_model, self.dtype))
    return out

  def _head_logits(self, h: Array) -> Array:
    """[..., D] -> [..., V_0 + n_tail] float32 head logits."""
    h0 = self._project_out(0, h)
    table = self.tables[0] if self.output is None else self.output
    logits = jnp.dot(h0, table.astype(self.dtype).T)
    if len(self.bounds) > 1:
      clusters = jnp.dot(
          h.astype(self.dtype), self.cluster_weight.astype(self.dtype)
      )
      logits = jnp.concatenate([logits, clusters], axis=-1)
    return logits.astype(jnp.float32)

  def _tail_logits(self, i: int, h: Array, deterministic: bool = True) -> Array:
    """[..., D] -> [..., V_i] logits of tail cluster i, in ``dtype``."""
    hi_ = self._project_out(i, h)
    if self.tail_dropout > 0:
      hi_ = self.dropout(hi_, deterministic=deterministic)
    return jnp.dot(hi_, self.tables[i].astype(self.dtype).T)

  def _tail_log_softmax(
      self, i: int, h: Array, deterministic: bool = True
  ) -> Array:
    """[..., D] -> [..., V_i] float32 log-softmax within tail cluster i."""
    logits = self._tail_logits(i, h, deterministic)
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

  def _tail_target(
      self, i: int, h: Array, index: Array, deterministic: bool = True
  ) -> Array:
    """h [N, D], index [N] within cluster i -> [N] float32 log-probability.

    In float32 it picks from the whole log-softmax (the reference). In a
    narrower compute dtype it never forms the [N, V_i] float32 log-softmax
    (the largest buffer of a bfloat16 step of a large vocabulary):
    ``narrow_log_softmax_stats``.
    """
    if jnp.dtype(self.dtype) == jnp.float32:
      tail = self._tail_log_softmax(i, h, deterministic)
      return jnp.take_along_axis(tail, index[..., None], axis=-1)[..., 0]
    logits = self._tail_logits(i, h, deterministic)
    return narrow_log_softmax_stats(logits, index)[0]

  def _score_chunk(
      self, h: Array, y: Array, deterministic: bool = True
  ) -> tuple[Array, Array]:
    """Scores one chunk: h [..., D], y [...] -> (log p(y), log Z_head) [...]."""
    head = self._head_logits(h)
    log_z = jax.nn.logsumexp(head, axis=-1)
    head_lp = head - log_z[..., None]
    lo0, hi0 = self.bounds[0]
    in_head = y < hi0
    lp = jnp.take_along_axis(
        head_lp, jnp.clip(y, 0, hi0 - 1)[..., None], axis=-1
    )[..., 0]
    lp = jnp.where(in_head, lp, 0.0)
    for i in range(1, len(self.bounds)):
      lo, hi = self.bounds[i]
      in_c = (y >= lo) & (y < hi)
      tail_lp = self._tail_target(
          i, h, jnp.clip(y - lo, 0, hi - lo - 1), deterministic
      )
      lp = jnp.where(in_c, head_lp[..., hi0 + i - 1] + tail_lp, lp)
    return lp, log_z

  def _score_flat(
      self, h: Array, y: Array, deterministic: bool
  ) -> tuple[Array, Array]:
    """``_score_chunk`` of h [B, P, D], y [B, P] as [B * P] tokens: the
    rows stay the major axis, so a batch split over devices stays split,
    and the products have the shapes a flat batch of tokens gives them
    (the same rounding as scoring the tokens of the batch flat)."""
    lp, lz = self._score_chunk(
        h.reshape(-1, h.shape[-1]), y.reshape(-1), deterministic
    )
    return lp.reshape(y.shape), lz.reshape(y.shape)

  def chunk_positions(self, rows: int, positions: int) -> int:
    """Positions per row scored at a time (``chunk_layout``)."""
    return chunk_layout(rows, positions, self.chunk_size)[0]

  def score(
      self, h: Array, targets: Array, deterministic: bool = True
  ) -> tuple[Array, Array]:
    """Log-probability of the targets and the head log-normaliser.

    The positions are scored in chunks of at most ``chunk_size`` tokens
    (all rows, ``chunk_positions`` positions of each, spread evenly:
    ``chunk_layout``), so only [rows, chunk, V_i] tail logits are alive at
    once. The rows (the leading, batch axis)
    stay leading through the chunking: a batch split over devices is scored
    by its own devices, each chunk a slice of every device's rows. (Cutting
    flattened tokens into chunks would make every device score every
    chunk.)

    Args:
      h: [B, ..., D] final hidden states (or [D] / [N, D]: one row).
      targets: [B, ...] int target ids.
      deterministic: disables the tail dropout.

    Returns:
      (target_logprob, log_z), each [B, ...] float32.
    """
    lead = targets.shape
    rows = lead[0] if len(lead) > 1 else 1
    hf = h.reshape(rows, -1, h.shape[-1])
    yf = targets.reshape(rows, -1)
    n = yf.shape[1]
    chunk = self.chunk_positions(rows, n)
    if n <= chunk:
      lp, lz = self._score_flat(hf, yf, deterministic)
      return lp.reshape(lead), lz.reshape(lead)
    # Rematerialised in the backward pass, for the same bound on memory.
    pad = (-n) % chunk
    hf = jnp.pad(hf, ((0, 0), (0, pad), (0, 0)))
    yf = jnp.pad(yf, ((0, 0), (0, pad)))
    hs = hf.reshape(rows, -1, chunk, hf.shape[-1]).swapaxes(0, 1)
    ys = yf.reshape(rows, -1, chunk).swapaxes(0, 1)
    hs = nn.with_logical_constraint(hs, (None, "batch", "length", "embed"))
    ys = nn.with_logical_constraint(ys, (None, "batch", "length"))
    fn = nn.remat(lambda mdl, hy: mdl._score_flat(*hy, deterministic))

    def body(mdl, carry, hy):
      return carry, fn(mdl, hy)

    _, (lp, lz) = nn.scan(
        body,
        variable_broadcast="params",
        split_rngs={"params": False, "dropout": True},
        length=hs.shape[0],
        unroll=stack.unroll_factor(hs.shape[0]),
    )(self, None, (hs, ys))

    def unchunk(x: Array) -> Array:
      return x.swapaxes(0, 1).reshape(rows, -1)[:, :n].reshape(lead)

    return unchunk(lp), unchunk(lz)

  def log_probs(self, h: Array, with_log_z: bool = False) -> Any:
    """Full log-distribution over the vocabulary.

    Args:
      h: [..., D] hidden states (keep the leading size small: this
        materialises [..., V]).
      with_log_z: also return the head's log-normaliser (``score``'s).

    Returns:
      [..., V] float32 log-probabilities; with ``with_log_z``, the pair of
      them and [...] float32 log Z_head.
    """
    lead = h.shape[:-1]
    hf = h.reshape(-1, h.shape[-1])
    logits = self._head_logits(hf)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    head = logits - log_z[:, None]
    hi0 = self.bounds[0][1]
    parts = [head[:, :hi0]]
    for i in range(1, len(self.bounds)):
      parts.append(
          head[:, hi0 + i - 1 : hi0 + i] + self._tail_log_softmax(i, hf)
      )
    out = jnp.concatenate(parts, axis=-1).reshape(lead + (self.vocab_size,))
    return (out, log_z.reshape(lead)) if with_log_z else out
