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

What a step reads (``MemoryReader``): M_local, the (g, next token) pairs of
every earlier position of the context, g computed in that context. It is
what ``--mode=memeval`` reads in the stream's first window, so a context of
at most ``window_len`` predictions (``eval.window_len``) is scored exactly as
evaluation scores it; the decoder refuses a longer one in one line. The
long-term memory M_long holds the pairs before a window, and the first
window has none, so its size N changes nothing here. A kind with an
external memory (kNN-LM, TRIMELM_ext, kNN-LM with the cache) also reads the
K nearest pairs of a datastore: the query goes to the host
(``jax.pure_callback``), where ``search`` (``eval.external.ExternalSearch``,
the one evaluation uses) returns their scores and tokens, and the external
sums join the local ones as ``eval.external.make_combine_fn`` joins them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax.memory import blockwise
from memjax.memory import evaluation

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


def _logsumexp(scores: Array, valid: Array) -> Array:
  """[B, L] -> [B] over the valid entries, -inf where there is none."""
  s = jnp.where(valid, scores, -jnp.inf)
  peak = jnp.max(s, axis=-1, keepdims=True)
  shift = jnp.where(jnp.isfinite(peak), peak, 0.0)
  total = jnp.sum(jnp.where(valid, jnp.exp(s - shift), 0.0), axis=-1)
  ok = total > 0
  return jnp.where(
      ok, shift[:, 0] + jnp.log(jnp.where(ok, total, 1.0)), -jnp.inf
  )


@dataclasses.dataclass(frozen=True)
class MemoryReader:
  """One setting of an evaluation memory, read at each generation step.

  Attributes:
    kind: the memory's name (``eval_memory.kind``).
    memory: the evaluation memory (it reads M_local, no external memory).
    settings: (axis values name, (one value,)) per axis of the kind.
    window_len: the predictions one evaluation window holds; a context
      longer than that is refused.
    search: for a kind with an external memory, the host's search
      (``neighbours(queries [B, D]) -> (scores [B, K] float32, -inf for
      none; tokens [B, K] int)``) and its ``k``; None otherwise.
  """

  kind: str
  memory: evaluation.EvalMemory = dataclasses.field(compare=False)
  settings: tuple[tuple[str, tuple[float, ...]], ...]
  window_len: int
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

  @classmethod
  def of(cls, grid: Any, window_len: int, search: Any = None) -> "MemoryReader":
    """The reader of a one-setting ``eval.grid.Grid``."""
    return cls(grid.kind, grid.memory, grid.settings, int(window_len), search)

  def values(self) -> Mapping[str, Sequence[float]]:
    """The kind's ``AxisValues``."""
    return dict(self.settings)

  def check_length(self, predictions: int) -> None:
    """Raises errors.ConfigError when a context of ``predictions``
    predictions does not fit one evaluation window."""
    if predictions > self.window_len:
      raise errors.ConfigError(
          f"generate with the {self.kind} memory reads one evaluation "
          f"window: a prompt and its new tokens make {predictions} "
          f"predictions, more than eval.window_len {self.window_len}; "
          "shorten the prompt or num_tokens, or raise eval.window_len"
      )

  def log_probs(
      self,
      logp: Array,
      log_z: Array,
      query: Array,
      keys: Array,
      key_tokens: Array,
      visible: Array,
  ) -> Array:
    """The memory's next-token log-probabilities of a batch of queries.

    Args:
      logp: [B, V] float32 the plain model's log-probabilities.
      log_z: [B] float32 its (head) log-normaliser.
      query: [B, D] g of the position that predicts.
      keys: [B, L, D] g of the context's positions.
      key_tokens: [B, L] int the token that followed each.
      visible: [B, L] bool, the entries the query reads (M_local).

    Returns:
      [B, V] float32 log-probabilities, as ``combine`` gives each target.
    """
    b, v = logp.shape
    values = self.values()
    scales = self.memory.scales(values, query.shape[-1])
    sums = []
    if self.memory.reads_local:
      sim = jnp.einsum(
          "bd,bld->bl", query.astype(jnp.float32), keys.astype(jnp.float32)
      )
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
  lse_all = jnp.stack([_logsumexp(sim * c, valid) for c in scales])
  lse_pos = jnp.stack(
      [token_logsumexp(sim * c, tokens, valid, v) for c in scales]
  )
  return jnp.broadcast_to(lse_all[..., None], lse_pos.shape), lse_pos
