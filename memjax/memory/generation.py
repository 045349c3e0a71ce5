"""Evaluation memories read while generating: the whole next-token law.

``--mode=memeval`` scores one target per query: an evaluation memory's
``combine`` takes the plain model's log p(y), its log-normaliser and the
log-sum-exps of the similarities over the query's visible memory, all of
it (lse_all) and the entries whose token is y (lse_pos). Every kind's
``combine`` is elementwise over the queries, so a query's whole
distribution is ``combine`` evaluated with every token w of the
vocabulary as the target: the plain model's log p(w) [V], the same lse_all
for every w, and lse_pos [V], a log-sum-exp per token over the entries
(``token_logsumexp``: a segment maximum and a segment sum over the
entries' tokens, the maximum taken per token as ``evaluation.local_sums``
takes it). Whichever token follows, its log-probability is then exactly the
one evaluation gives it: same kind, same settings, same sums.

What a step reads: what ``--mode=memeval`` reads for the same prediction,
in evaluation's sliding windows of ``eval.window_len`` T predictions that
score their last ``eval.score_len`` S, which the decoder keeps
(``models.decode_windows``: a row's window slides when its prediction
reaches T + kS, and is run again in place). It reads M_local, the
(g, next token) pairs of the window's positions before the query, with g
from this window (``Context.features``), and M_long, the
``eval_memory.long_mem_tokens`` N pairs before the window (or before its
first scored position: ``long_span`` 'last_scored'), each with the g of
the window that scored it (``Context.scored``), as ``memory.evaluation``
reads them. The decoder prefills a prompt's first window and feeds the
rest of it one cached step at a time, the windows sliding over it as over
the continuation, so a prompt of any length reads what evaluation reads.

A kind with an external memory (kNN-LM, TRIMELM_ext, kNN-LM with the
cache) also reads the K nearest pairs of a datastore: the query goes to
the host (``jax.pure_callback``), where ``search``
(``eval.external.ExternalSearch``, the one evaluation uses) returns their
scores and tokens, and the external sums join the local ones as
``eval.external.make_combine_fn`` joins them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax.memory import blockwise
from memjax.memory import evaluation
from memjax.models import decode_windows

Array = jax.Array


def token_logsumexp(
    scores: Array, tokens: Array, valid: Array, vocab_size: int
) -> Array:
  """Per token w, the log-sum-exp of the scores of the entries whose token
  is w.

  Args:
    scores: [B, L] float32.
    tokens: [B, L] int entry tokens in [0, vocab_size).
    valid: [B, L] bool, the entries that count.
    vocab_size: V.

  Returns:
    [B, V] float32, -inf for a token with no valid entry.
  """
  seg = jnp.where(valid, tokens, vocab_size)  # Invalid ones: segment V.
  s = jnp.where(valid, scores.astype(jnp.float32), -jnp.inf)
  n = vocab_size + 1
  peak = jax.vmap(lambda x, i: jax.ops.segment_max(x, i, n))(s, seg)
  shift = jnp.where(jnp.isfinite(peak), peak, 0.0)
  terms = jnp.where(
      valid, jnp.exp(s - jnp.take_along_axis(shift, seg, axis=1)), 0.0
  )
  total = jax.vmap(lambda x, i: jax.ops.segment_sum(x, i, n))(terms, seg)
  ok = total > 0
  out = jnp.where(ok, shift + jnp.log(jnp.where(ok, total, 1.0)), -jnp.inf)
  return out[:, :vocab_size]


@dataclasses.dataclass(frozen=True)
class MemoryReader:
  """One setting of an evaluation memory, read at each generation step.

  Attributes:
    kind: the memory's name (``eval_memory.kind``).
    memory: the evaluation memory.
    settings: (axis values name, (one value,)) per axis of the kind.
    window_len: T, the predictions of an evaluation window
      (``eval.window_len``).
    score_len: S, the predictions a window after the first scores.
    long_tokens: N, the pairs of M_long (``eval_memory.long_mem_tokens``).
    long_span: which N pairs (``evaluation.LONG_SPANS``).
    bos: the BOS id evaluation's windows after the first begin with
      (``data.windows.begin_with_bos``), or None.
    search: for a kind with an external memory, the host's search
      (``neighbours(queries [B, D]) -> (scores [B, K] float32, -inf for
      none; tokens [B, K] int)``) and its ``k``; None otherwise.
  """

  kind: str
  memory: evaluation.EvalMemory = dataclasses.field(compare=False)
  settings: tuple[tuple[str, tuple[float, ...]], ...]
  window_len: int
  score_len: int
  long_tokens: int = 0
  long_span: str = "before_window"
  bos: Optional[int] = None
  search: Any = dataclasses.field(default=None, compare=False)

  def __post_init__(self) -> None:
    if not self.memory.uses_memory:
      raise errors.ConfigError(
          f"evaluation memory {self.kind!r} reads no memory: generate "
          "without one"
      )
    if self.memory.external_metric and self.search is None:
      raise errors.ConfigError(
          f"evaluation memory {self.kind!r} searches an external datastore, "
          "and none was given"
      )
    many = [name for name, v in self.settings if len(v) != 1]
    if many:
      raise errors.ConfigError(
          f"generation with memory {self.kind!r} takes one value of "
          f"{', '.join(many)}, got {dict(self.settings)}"
      )
    self.memory.check(self.values())
    if not 1 <= self.score_len <= self.window_len or self.long_tokens < 0:
      raise errors.ConfigError(
          f"generate with a memory needs 1 <= eval.score_len "
          f"({self.score_len}) <= eval.window_len ({self.window_len}) and "
          f"eval_memory.long_mem_tokens ({self.long_tokens}) >= 0"
      )
    evaluation.long_memory_end(0, 0, self.long_span)  # Checks the name.

  @classmethod
  def of(cls, grid: Any, scoring: Any, search: Any = None) -> "MemoryReader":
    """The reader of a one-setting ``eval.grid.Grid`` for a restored run's
    ``scoring`` (``eval.rows.Scoring``: its windows, span and BOS)."""
    return cls(
        grid.kind,
        grid.memory,
        grid.settings,
        int(scoring.eval.window_len),
        int(scoring.eval.score_len),
        int(grid.long_sizes[0]),
        str(scoring.memory.long_mem_span),
        scoring.window_bos,
        search,
    )

  def values(self) -> Mapping[str, Sequence[float]]:
    """The kind's ``AxisValues``."""
    return dict(self.settings)

  @property
  def windows(self) -> decode_windows.Windows:
    """The windows the reader reads in: evaluation's."""
    return decode_windows.Windows(self.window_len, self.score_len, self.bos)

  def read(
      self,
      scores: tuple[Array, Array],
      context: decode_windows.Context,
      key_valid: Array,
      slot: Array,
  ) -> Array:
    """The memory's next-token log-probabilities [B, V] of the query at
    ``slot``, from the plain model's (log p [B, V], log Z [B]).

    M_local: the window's slots before the query; M_long: the N stream
    positions before ``evaluation.long_memory_end`` of the window.
    """
    logp, log_z = scores
    slots = jnp.arange(key_valid.shape[1])[None, :]
    local = self.windows.window_valid(context, key_valid) & (slots < slot)
    ends = evaluation.long_memory_end(
        context.start,
        jnp.full_like(context.start, self.window_len - self.score_len),
        self.long_span,
    )
    stream = slots - context.offset[:, None]
    long = (
        key_valid
        & (stream < ends[:, None])
        & (stream >= ends[:, None] - self.long_tokens)
    )
    query = jax.lax.dynamic_index_in_dim(
        context.features, slot, axis=1, keepdims=False
    )
    sim = lambda keys: jnp.einsum("bd,bld->bl", query, keys)  # noqa: E731
    return self.log_probs(
        logp,
        log_z,
        query,
        jnp.concatenate([sim(context.features), sim(context.scored)], axis=1),
        jnp.concatenate([context.next_tokens] * 2, axis=1),
        jnp.concatenate([local, long], axis=1),
    )

  def log_probs(
      self,
      logp: Array,
      log_z: Array,
      query: Array,
      sim: Array,
      key_tokens: Array,
      visible: Array,
  ) -> Array:
    """The memory's next-token log-probabilities of a batch of queries.

    Args:
      logp: [B, V] float32 the plain model's log-probabilities.
      log_z: [B] float32 its (head) log-normaliser.
      query: [B, D] g of the position that predicts (an external kind's
        search key).
      sim: [B, L] float32 g . g_j of the query and the context's entries.
      key_tokens: [B, L] int the token that followed each.
      visible: [B, L] bool, the entries the query reads (M_local and
        M_long).

    Returns:
      [B, V] float32 log-probabilities, as ``combine`` gives each target.
    """
    b, v = logp.shape
    values = self.values()
    scales = self.memory.scales(values, query.shape[-1])
    sums = []
    if self.memory.reads_local:
      sums.append(_sums(sim, key_tokens, visible, scales, v))
    if self.memory.external_metric:
      scores, tokens = self._neighbours(query)
      found = jnp.isfinite(scores)
      sums.append(
          _sums(jnp.where(found, scores, 0.0), tokens, found, scales, v)
      )
    if len(sums) == 2 and self.memory.joins_local:
      sums = [tuple(blockwise.logaddexp(a, e) for a, e in zip(*sums))]
    elif len(sums) == 2:  # Two distributions of their own.
      sums = [sums[0] + sums[1]]
    z = jnp.broadcast_to(log_z[:, None], (b, v))
    out = self.memory.combine(values, logp, z, sums)
    assert math.prod(out.shape[:-2]) == 1, out.shape  # One setting.
    return out.reshape(b, v)

  def _neighbours(self, query: Array) -> tuple[Array, Array]:
    """The K nearest datastore entries of queries [B, D], from the host:
    (scores [B, K] float32, -inf for none; tokens [B, K] int32)."""
    shapes = (
        jax.ShapeDtypeStruct((query.shape[0], self.search.k), jnp.float32),
        jax.ShapeDtypeStruct((query.shape[0], self.search.k), jnp.int32),
    )

    def host(q):
      scores, tokens = self.search.neighbours(np.asarray(q))
      return scores.astype(np.float32), tokens.astype(np.int32)

    return jax.pure_callback(
        host, shapes, query.astype(jnp.float32), vmap_method="sequential"
    )


def _sums(
    sim: Array, tokens: Array, valid: Array, scales: Sequence[float], v: int
) -> tuple[Array, Array]:
  """(lse_all, lse_pos), each [G, B, V], of entries' similarities [B, L]
  at each scale: over the valid entries, and per token."""
  if sim.shape[1] == 0:  # No entry (an empty datastore).
    empty = jnp.full((len(scales), sim.shape[0], v), -jnp.inf, jnp.float32)
    return empty, empty
  lse_all = jnp.stack(
      [blockwise.masked_logsumexp(sim * c, valid) for c in scales]
  )
  lse_pos = jnp.stack(
      [token_logsumexp(sim * c, tokens, valid, v) for c in scales]
  )
  return jnp.broadcast_to(lse_all[..., None], lse_pos.shape), lse_pos
