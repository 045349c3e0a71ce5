"""Evaluation memories: the kinds, the long-term bank and the memory sums.

An evaluation memory kind (``EvalMemory``, declared by the engine or a
method under the name ``eval_memory.kind`` picks) scores each query from the plain model's outputs and the
log-sum-exps of similarities over the query's visible memory M = M_local u
M_long (``memjax/eval/memory_step.py`` says which entries each query sees):
it names its grid axes, the similarity scales of its memory sums and how it
combines them with the plain model's scores. 'none', the plain model, is
here; the methods declare theirs (TRIME's Eq. 6, the continuous cache, the
external memories) in their packages.

One pass scores a whole grid of settings (memory sizes N and the kind's
axes), since the model's outputs do not depend on them; N = 0 is exactly
local evaluation.

The maths shared by every kind: the FIFO ``Bank`` of long-term entries, and
``local_sums`` / ``long_sums``, the log-sum-exps over M_local and M_long at a
vector of scales.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional, Sequence

import flax
import jax
import jax.numpy as jnp

from memjax import errors
from memjax.memory import blockwise

Array = jax.Array

# {an axis's values name ('temperatures'): the values} of one evaluation.
AxisValues = Mapping[str, Sequence[float]]


class Axis(NamedTuple):
  """One tunable setting of an evaluation memory.

  Attributes:
    key: the setting's name in results and its key in ``section``
      ('temperature').
    values: the ``AxisValues`` entry (and ``memory_grid.Grid`` keyword)
      holding its values ('temperatures').
    config_grid: the key in ``section`` of its tuning grid.
    default: its values when a grid leaves it out.
    section: the settings class (its method's section) that declares
      ``key`` and ``config_grid``.
  """

  key: str
  values: str
  config_grid: str
  default: tuple[float, ...] = ()
  section: Optional[type] = None

  def value(self, sections: Mapping[type, Any]) -> float:
    """Its configured value in a run's ``Settings.sections``."""
    return float(getattr(sections[self.section], self.key))

  def grid(self, sections: Mapping[type, Any]) -> tuple[float, ...]:
    """Its configured tuning grid in a run's ``Settings.sections``."""
    return tuple(getattr(sections[self.section], self.config_grid))


class EvalMemory:
  """An evaluation-time memory kind (``extend.Method.eval_memories``).

  A kind scores each query from the plain model's outputs and the
  log-sum-exps of similarities over the query's visible memory (M_local and
  M_long), computed at the similarity scales the kind asks for.

  Attributes:
    axes: its settings besides the memory size N, in the order of the
      output's grid axes; none for a kind without memory.
    label: how plots name it.
  """

  axes: tuple[Axis, ...] = ()
  label: str = ""
  # The key (of the settings class ``sweep_source_section``) that may name
  # another run whose checkpoint --mode=memsweep scores this kind on ('' =
  # none).
  sweep_source_key: str = ""
  sweep_source_section: Optional[type] = None
  # An external memory (``memory/external.py``): the metric its neighbours
  # are searched with ('dot_product' | 'squared_l2'), '' for none; and
  # whether the kind also reads M_local u M_long.
  external_metric: str = ""
  reads_local: bool = True
  # With both: whether the external neighbours join M_local u M_long in one
  # softmax (TRIMELM_ext) or form a distribution of their own (kNN-LM with a
  # continuous cache); ``combine`` then gets (lse_all, lse_pos, ext_all,
  # ext_pos) per memory size.
  joins_local: bool = True

  @property
  def uses_memory(self) -> bool:
    """Whether the kind reads a memory (False: the plain model)."""
    return bool(self.axes)

  def check(self, settings: AxisValues) -> None:
    """Raises errors.ConfigError for settings the kind cannot score."""
    del settings

  def scales(self, settings: AxisValues, dim: int) -> list[float]:
    """The similarity scales of the memory sums, [G] (g . g_j * scale)."""
    raise NotImplementedError

  def combine(
      self,
      settings: AxisValues,
      lm: Array,
      log_z: Array,
      sums: Sequence[tuple[Array, Array]],
  ) -> Array:
    """Log-probabilities of every setting.

    Args:
      settings: the grid's values per axis.
      lm: [W, S] float32 log p of the plain model.
      log_z: [W, S] float32 its log-normaliser.
      sums: per memory size N, (lse_all, lse_pos) [G, W, S] over the visible
        memory and over its entries whose token is the target, at each of
        ``scales``.

    Returns:
      [N, *axis sizes, W, S] float32.
    """
    raise NotImplementedError


class PlainModel(EvalMemory):
  """No memory: the plain model's scores only."""


@flax.struct.dataclass
class Bank:
  """A FIFO long-term memory of (g, next token) pairs.

  Attributes:
      keys: [C, D] float32 memory features g.
      tokens: [C] int32 the token that followed each entry.
      positions: [C] int32 stream position (prediction index) of each
          entry, ascending; -1 marks an empty slot (empty slots come first).
  """

  keys: Array
  tokens: Array
  positions: Array

  @property
  def capacity(self) -> int:
    return self.positions.shape[0]


def init_bank(capacity: int, dim: int) -> Bank:
  """An empty bank of ``capacity`` slots of dimension ``dim``."""
  return Bank(
      keys=jnp.zeros((capacity, dim), jnp.float32),
      tokens=jnp.zeros((capacity,), jnp.int32),
      positions=jnp.full((capacity,), -1, jnp.int32),
  )


def push(bank: Bank, keys: Array, tokens: Array, positions: Array) -> Bank:
  """Adds entries and keeps the ``capacity`` with the largest positions.

  Args:
      bank: the bank.
      keys: [M, D] float features of the new entries.
      tokens: [M] int tokens.
      positions: [M] int stream positions, -1 for entries to drop. Positions
          must be distinct from each other and from the bank's.

  Returns:
      The bank of the last ``capacity`` pairs of the stream so far
      (positions ascending).
  """
  cap = bank.capacity
  if cap == 0:
    return bank
  all_pos = jnp.concatenate([bank.positions, positions.astype(jnp.int32)])
  all_keys = jnp.concatenate([bank.keys, keys.astype(jnp.float32)])
  all_tok = jnp.concatenate([bank.tokens, tokens.astype(jnp.int32)])
  _, idx = jax.lax.top_k(all_pos, cap)  # descending positions
  idx = idx[::-1]  # ascending; empties first
  return Bank(keys=all_keys[idx], tokens=all_tok[idx], positions=all_pos[idx])


def take_scored(x: Array, score_from: Array, score_len: int) -> Array:
  """[W, T, ...] -> [W, S, ...]: offsets score_from + [0, S) of each row."""
  t = x.shape[1]
  idx = jnp.minimum(score_from[:, None] + jnp.arange(score_len)[None, :], t - 1)
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


@flax.struct.dataclass
class Queries:
  """The scored positions of a batch of W windows (S per window).

  Attributes:
      g: [W, S, D] their features.
      targets: [W, S] int32 next tokens.
      positions: [W, S] int32 stream positions, -1 where not scored.
      offsets: [W, S] int offsets in their window.
  """

  g: Array
  targets: Array
  positions: Array
  offsets: Array


def scored_queries(
    features: Array, batch: dict[str, Array], score_len: int
) -> Queries:
  """The queries of a ``data.windows.memory_eval_batches`` batch.

  Args:
    features: [W, T, D] g of every position of the windows.
    batch: 'targets', 'position' [W, T]; 'score_from', 'score_count' [W].
    score_len: S.
  """
  take = lambda x: take_scored(x, batch["score_from"], score_len)  # noqa: E731
  weights = jnp.arange(score_len)[None, :] < batch["score_count"][:, None]
  return Queries(
      g=take(features),
      targets=take(batch["targets"]),
      positions=jnp.where(weights, take(batch["position"]), -1),
      offsets=batch["score_from"][:, None] + jnp.arange(score_len)[None, :],
  )


def local_sums(
    queries: Array,
    query_offsets: Array,
    query_targets: Array,
    keys: Array,
    key_tokens: Array,
    key_valid: Array,
    scales: Array,
) -> tuple[Array, Array]:
  """Log-sum-exps over each window's own earlier positions (M_local).

  Args:
      queries: [W, S, D] g of the scored positions.
      query_offsets: [W, S] int offsets of the queries in their window.
      query_targets: [W, S] int targets.
      keys: [W, T, D] g of every position of the window.
      key_tokens: [W, T] int next token of every position.
      key_valid: [W, T] bool.
      scales: [G] float32 similarity scales (one per grid setting).

  Returns:
      (lse_all, lse_pos), each [G, W, S] float32, -inf where empty.
  """
  t = keys.shape[1]
  sim = jnp.einsum(
      "wsd,wtd->wst", queries.astype(jnp.float32), keys.astype(jnp.float32)
  )
  vis = key_valid[:, None, :] & (
      jnp.arange(t)[None, None, :] < query_offsets[:, :, None]
  )
  pos = vis & (key_tokens[:, None, :] == query_targets[:, :, None])

  def lse(mask, s):
    m = jnp.max(jnp.where(mask, s, -jnp.inf), axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    total = jnp.sum(
        jnp.where(mask, jnp.exp(jnp.where(mask, s, m) - m), 0.0), -1
    )
    ok = total > 0
    return jnp.where(
        ok, m[..., 0] + jnp.log(jnp.where(ok, total, 1.0)), -jnp.inf
    )

  def one(scale):
    s = sim * scale
    return lse(vis, s), lse(pos, s)

  return jax.vmap(one)(scales)


# Where M_long ends for a window (``long_memory_end``): its N positions are
# [end - N, end).
LONG_SPANS = ("before_window", "last_scored")


def long_memory_end(start: Array, score_from: Array, span: str) -> Array:
  """[W] the stream position M_long ends at (exclusive), per window.

  Args:
    start: [W] int first prediction of each window.
    score_from: [W] int first scored offset of each window.
    span: 'before_window': the N predictions before the window (memjax's
      reading; M_long and M_local do not overlap); 'last_scored': the last
      N scored predictions before the window's first scored one, the
      authors' ``--mem-size N`` (princeton-nlp/TRIME
      ``fairseq/sequence_scorer.py`` 63-86 and 232-238 keep the last N
      scored (g, y), read whole by every query of the next window;
      ``fairseq/data/lm_context_window_dataset.py`` 44-56 marks only the
      new tokens as targets), which overlap the window's context part. The
      copies of the stream's first window (start 0,
      ``data.windows.memory_eval_windows``) are one window there, scored
      with no M_long.
  """
  if span == "before_window":
    return start
  if span == "last_scored":
    return jnp.where(start > 0, start + score_from, start)
  raise errors.ConfigError(
      f"eval_memory.long_mem_span must be one of {', '.join(LONG_SPANS)}, "
      f"got {span!r}"
  )


def long_sums(
    queries: Array,
    query_targets: Array,
    query_starts: Array,
    keys: Array,
    key_tokens: Array,
    key_positions: Array,
    long_tokens: int,
    scales: Array,
    block_size: int | None,
) -> tuple[Array, Array]:
  """Log-sum-exps over M_long: keys at positions [end - N, end).

  Args:
      queries: [Q, D] g.
      query_targets: [Q] int.
      query_starts: [Q] int where each query's M_long ends
        (``long_memory_end``).
      keys: [K, D] candidate long-term entries.
      key_tokens: [K] int.
      key_positions: [K] int, -1 for empty entries.
      long_tokens: N.
      scales: [G] float32 similarity scales.
      block_size: blockwise key/query block (None: dense).

  Returns:
      (lse_all, lse_pos), each [G, Q] float32.
  """

  def visible(q_start, k_pos):
    return (k_pos[None, :] < q_start[:, None]) & (
        k_pos[None, :] >= q_start[:, None] - long_tokens
    )

  def one(scale):
    return blockwise.memory_logsumexp(
        queries,
        keys,
        query_targets,
        key_tokens,
        key_positions >= 0,
        scale=scale,
        query_meta=query_starts,
        key_meta=key_positions,
        visible_fn=visible,
        block_size=block_size,
    )

  return jax.vmap(one)(scales)


def bank_capacity(
    memory: EvalMemory,
    long_sizes: Sequence[int],
    window_len: int,
    score_len: int,
) -> int:
  """Slots the bank needs: max(N) + T - S (0 without a long memory)."""
  n = max([int(x) for x in long_sizes] or [0])
  if not memory.uses_memory or n == 0:
    return 0
  return n + window_len - score_len
