"""Evaluation with testing memories (TRIME paper, Eq. 6-7 and Appendix A).

A split is scored with sliding windows (``streams.memory_eval_batches``):
window w covers predictions [start_w, start_w + T) and scores S of them
(queries). Each query c at stream position p sees

* M_local: the (g, next token) pairs of every earlier position of its own
  window, context part included, with g computed in this window;
* M_long (optional): the N pairs of the stream positions
  [start_w - N, start_w), i.e. the N predictions just before the window,
  each with the g computed in the window that scored it. They are carried
  across windows in a FIFO ``Bank`` that holds the last N + T - S scored
  pairs (the window's context part is scored earlier but belongs to
  M_local, so the bank reaches back that much further).

Scoring, per query, over the visible set M = M_local u M_long:

* ``trime`` (Eq. 6): log p(y) = log (exp(log Z + log p_vocab(y)) + sum_{pos}
  exp(sim / tau)) - log (Z + sum_M exp(sim / tau)), sim = g . g_j / sqrt(d);
  the temperature tau divides the memory logits only.
* ``cache`` (Grave et al. 2017, "adapted to long-term memory" when N > 0):
  (1 - lam) p_lm(y) + lam sum_{pos} exp(theta g . g_j) / sum_M exp(theta g . g_j).

One pass scores a whole grid of settings (memory sizes N, temperatures or
(theta, lam)), since the model's outputs do not depend on them; N = 0 is
exactly local evaluation, and lam = 0 exactly the plain model.

Each kind is an ``EvalMemory`` registered in ``memjax.registry.EVAL_MEMORIES``
under the name ``eval_memory.kind`` picks: it names its grid axes, the
similarity scales of its memory sums and how it combines them with the plain
model's scores. 'none' is here; 'trime' registers in ``memory/trime.py`` and
'cache' in ``memory/cache.py``.

The split is one stream: windows, and so M_local and M_long, run across
document boundaries, as the attention context of the sliding-window
protocol does (WikiText-103's test set is evaluated as one stream in the
paper's setup).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import flax
import jax
import jax.numpy as jnp

from memjax import errors
from memjax import registry
from memjax.memory import blockwise

Array = jax.Array

Settings = Mapping[str, Sequence[float]]


class Axis(NamedTuple):
  """One tunable setting of an evaluation memory.

  Attributes:
    key: the setting's name in results ('temperature').
    values: the ``Settings`` entry (and ``evaluate_memory.Grid`` field)
      holding its values ('temperatures').
    config_grid: the ``config.eval_memory`` key of its tuning grid.
  """

  key: str
  values: str
  config_grid: str


class EvalMemory:
  """An evaluation-time memory kind (``registry.EVAL_MEMORIES``).

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

  def check(self, settings: Settings) -> None:
    """Raises errors.ConfigError for settings the kind cannot score."""
    del settings

  def scales(self, settings: Settings, dim: int) -> list[float]:
    """The similarity scales of the memory sums, [G] (g . g_j * scale)."""
    raise NotImplementedError

  def combine(
      self,
      settings: Settings,
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


registry.EVAL_MEMORIES.register("none", PlainModel())


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


def _take_scored(x: Array, score_from: Array, score_len: int) -> Array:
  """[W, T, ...] -> [W, S, ...]: offsets score_from + [0, S) of each row."""
  t = x.shape[1]
  idx = jnp.minimum(score_from[:, None] + jnp.arange(score_len)[None, :], t - 1)
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


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
  """Log-sum-exps over M_long: keys at positions [start - N, start).

  Args:
      queries: [Q, D] g.
      query_targets: [Q] int.
      query_starts: [Q] int first position of each query's window.
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


def make_eval_step(
    model: Any,
    *,
    window_len: int,
    score_len: int,
    kind: str,
    long_sizes: Sequence[int] = (0,),
    temperatures: Sequence[float] = (1.0,),
    thetas: Sequence[float] = (),
    lambdas: Sequence[float] = (),
    block_size: int | None = 1024,
    extra_settings: Mapping[str, Sequence[float]] | None = None,
) -> Callable:
  """Builds ``step(params, bank, batch) -> (bank, outputs)`` (not jitted).

  Args:
      model: a TransformerLM (its outputs supply g, log p_vocab, log Z).
      window_len: T.
      score_len: S.
      kind: a name in ``registry.EVAL_MEMORIES`` ('none', 'trime', 'cache').
      long_sizes: memory sizes N to score (static; the bank holds
          max(N) + T - S pairs).
      temperatures: tau values ('trime').
      thetas: cache inverse temperatures ('cache').
      lambdas: cache weights ('cache').
      block_size: blockwise block of the long-memory sums.
      extra_settings: the values of other kinds' axes (``Axis.values`` ->
          values), e.g. 'ext_lambdas'.

  Returns:
      The step. ``batch`` is from ``streams.memory_eval_batches``. Outputs:
      'lm' [W, S] log p of the plain model; 'weights' [W, S] float32 (1 on
      scored queries); 'targets', 'positions' [W, S] int32; and, for a kind
      with memory, under its name the [len(long_sizes), *axis sizes, W, S]
      log-probabilities ('trime': [N, len(temperatures), W, S]; 'cache':
      [N, len(thetas), len(lambdas), W, S]). A kind with an external
      memory is combined later, after the host's search (see
      ``memory/external.py``): its outputs are instead 'queries' [W, S, D]
      float32 g, 'log_z' [W, S] and, if it reads M_local u M_long, 'sums'
      [len(long_sizes), 2, G, W, S] (lse_all, lse_pos at each scale).
  """
  memory = registry.EVAL_MEMORIES.get(kind)
  settings = {
      "temperatures": tuple(temperatures),
      "thetas": tuple(thetas),
      "lambdas": tuple(lambdas),
      **{k: tuple(v) for k, v in (extra_settings or {}).items()},
  }
  long_sizes = tuple(int(n) for n in long_sizes)
  if any(n < 0 for n in long_sizes):
    raise errors.ConfigError(
        f"long-term memory sizes must be >= 0, got {long_sizes}"
    )
  memory.check(settings)
  capacity = bank_capacity(kind, long_sizes, window_len, score_len)

  def step(params, bank: Bank, batch: dict[str, Array]):
    out = model.apply(
        {"params": params},
        batch["inputs"],
        batch["targets"],
        deterministic=True,
    )
    g = out.features
    take = lambda x: _take_scored(x, batch["score_from"], score_len)  # noqa: E731
    weights = jnp.arange(score_len)[None, :] < batch["score_count"][:, None]
    q = _Queries(
        g=take(g),
        targets=take(batch["targets"]),
        positions=jnp.where(weights, take(batch["position"]), -1),
        offsets=batch["score_from"][:, None] + jnp.arange(score_len)[None, :],
    )
    lm = take(out.target_logprob).astype(jnp.float32)
    log_z = take(out.log_z).astype(jnp.float32)
    result = {
        "lm": jnp.where(weights, lm, 0.0),
        "weights": weights.astype(jnp.float32),
        "targets": q.targets,
        "positions": q.positions,
    }
    if not memory.uses_memory:
      return bank, result
    if memory.external_metric and not memory.reads_local:
      result.update(queries=q.g.astype(jnp.float32), log_z=log_z)
      return bank, result
    scales = jnp.asarray(memory.scales(settings, g.shape[-1]), jnp.float32)
    sums = _memory_sums(
        q, g, batch, bank, scales, long_sizes, window_len - score_len,
        block_size,
    )  # fmt: skip
    if memory.external_metric:
      result.update(
          queries=q.g.astype(jnp.float32),
          log_z=log_z,
          sums=jnp.stack([jnp.stack(pair) for pair in sums]),
      )
    else:
      logp = memory.combine(settings, lm, log_z, sums)
      result[kind] = jnp.where(weights, logp, 0.0)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    new_bank = push(bank, flat(q.g), flat(q.targets), flat(q.positions))
    return new_bank, result

  step.capacity = capacity
  return step


@flax.struct.dataclass
class _Queries:
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


def _memory_sums(
    q: _Queries,
    g: Array,
    batch: dict[str, Array],
    bank: Bank,
    scales: Array,
    long_sizes: Sequence[int],
    context: int,
    block_size: int | None,
) -> list[tuple[Array, Array]]:
  """Per memory size N, (lse_all, lse_pos) [G, W, S] over M_local u M_long.

  Args:
      q: the scored queries.
      g: [W, T, D] features of every position of the windows (M_local).
      batch: the batch (``targets``, ``position``, ``start``).
      bank: the long-term memory before this batch.
      scales: [G] similarity scales.
      long_sizes: the sizes N.
      context: T - S, the context positions of a window.
      block_size: blockwise block of the long-memory sums.
  """
  key_valid = batch["position"] >= 0
  loc_all, loc_pos = local_sums(
      q.g, q.offsets, q.targets, g, batch["targets"], key_valid, scales
  )  # [G, W, S]
  flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
  starts = jnp.broadcast_to(batch["start"][:, None], q.positions.shape)
  per_size = []
  for n in long_sizes:
    if n == 0:
      per_size.append((loc_all, loc_pos))
      continue
    keep = n + context
    l_all, l_pos = long_sums(
        flat(q.g),
        flat(q.targets),
        flat(starts),
        jnp.concatenate([bank.keys[-keep:], flat(q.g).astype(jnp.float32)]),
        jnp.concatenate([bank.tokens[-keep:], flat(q.targets)]),
        jnp.concatenate([bank.positions[-keep:], flat(q.positions)]),
        n,
        scales,
        block_size,
    )
    shape = loc_all.shape
    per_size.append(
        (
            blockwise.logaddexp(loc_all, l_all.reshape(shape)),
            blockwise.logaddexp(loc_pos, l_pos.reshape(shape)),
        )
    )
  return per_size


def bank_capacity(
    kind: str, long_sizes: Sequence[int], window_len: int, score_len: int
) -> int:
  """Slots the bank needs: max(N) + T - S (0 without a long memory)."""
  n = max([int(x) for x in long_sizes] or [0])
  if not registry.EVAL_MEMORIES.get(kind).uses_memory or n == 0:
    return 0
  return n + window_len - score_len
