"""One batch of windows scored with testing memories (TRIME Eq. 6-7, App. A).

A split is scored with sliding windows (``data.windows.memory_eval_batches``):
window w covers predictions [start_w, start_w + T) and scores S of them
(queries). Each query c at stream position p sees

* M_local: the (g, next token) pairs of every earlier position of its own
  window, context part included, with g computed in this window;
* M_long (optional): the N pairs of the stream positions
  [start_w - N, start_w), i.e. the N predictions just before the window,
  each with the g computed in the window that scored it. They are carried
  across windows in a FIFO ``evaluation.Bank`` that holds the last
  N + T - S scored pairs (the window's context part is scored earlier but
  belongs to M_local, so the bank reaches back that much further). With
  ``long_span='last_scored'`` (the authors' ``--mem-size N``) M_long is
  instead the last N scored pairs before the window's first scored
  position, [s_w - N, s_w): it overlaps the window's context part, which
  M_local also holds, with the g of this window
  (``evaluation.long_memory_end``).

``make_eval_step`` builds the step that runs the model on a batch, sums the
similarities over M_local u M_long at the scales the memory kind asks for
(``memjax.memory.evaluation``) and lets the kind combine them with the plain
model's scores, for every setting of a grid in one pass (the model's
outputs do not depend on them). The split is one stream: windows, and so
M_local and M_long, run across document boundaries, as the attention
context of the sliding-window protocol does.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from memjax import errors
from memjax.memory import blockwise
from memjax.memory import evaluation
from memjax.memory.evaluation import Bank
from memjax.models import variables as model_vars

Array = jax.Array


def make_eval_step(
    model: Any,
    *,
    window_len: int,
    score_len: int,
    kind: str,
    memory: evaluation.EvalMemory,
    long_sizes: Sequence[int] = (0,),
    settings: Mapping[str, Sequence[float]] | None = None,
    block_size: int | None = 1024,
    long_span: str = "before_window",
) -> Callable:
  """Builds ``step(params, bank, batch) -> (bank, outputs)`` (not jitted).

  Args:
    model: a decoder LM (its outputs supply g, log p_vocab, log Z).
    window_len: T.
    score_len: S.
    kind: the memory's name (its outputs' key).
    memory: the evaluation memory.
    long_sizes: memory sizes N to score (static; the bank holds max(N) +
      T - S pairs).
    settings: the values of each of the kind's axes (``Axis.values`` ->
      values), e.g. {'temperatures': (1.0, 1.25)}.
    block_size: blockwise block of the long-memory sums.
    long_span: which N pairs M_long holds (``evaluation.LONG_SPANS``).

  Returns:
    The step; ``step.capacity`` is the bank's. ``batch`` is from
    ``data.windows.memory_eval_batches``. Outputs: 'lm' [W, S] log p of the
    plain model; 'weights' [W, S] float32 (1 on scored queries); 'targets',
    'positions' [W, S] int32; and, for a kind with memory, under its name
    the [len(long_sizes), *axis sizes, W, S] log-probabilities. A kind with
    an external memory is combined later, after the host's search
    (``memjax/eval/external.py``): its outputs are instead 'queries'
    [W, S, D] float32 g, 'log_z' [W, S] and, if it reads M_local u M_long,
    'sums' [len(long_sizes), 2, G, W, S] (lse_all, lse_pos at each scale).
  """
  settings, long_sizes = _checked(memory, settings, long_sizes, long_span)

  def step(params, bank: Bank, batch: dict[str, Array]):
    q, g, result, log_z = _forward(model, params, batch, score_len)
    weights = result["weights"] > 0
    if not memory.uses_memory:
      return bank, result
    if memory.external_metric and not memory.reads_local:
      result.update(queries=q.g.astype(jnp.float32), log_z=log_z)
      return bank, result
    scales = jnp.asarray(memory.scales(settings, g.shape[-1]), jnp.float32)
    sums = _memory_sums(
        q,
        g,
        batch,
        bank,
        scales,
        long_sizes,
        window_len - score_len,
        block_size,
        long_span,
    )
    if memory.external_metric:
      result.update(
          queries=q.g.astype(jnp.float32),
          log_z=log_z,
          sums=jnp.stack([jnp.stack(pair) for pair in sums]),
      )
    else:
      logp = memory.combine(settings, result["lm"], log_z, sums)
      result[kind] = jnp.where(weights, logp, 0.0)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    new_bank = evaluation.push(
        bank, flat(q.g), flat(q.targets), flat(q.positions)
    )
    return new_bank, result

  step.capacity = evaluation.bank_capacity(
      memory, long_sizes, window_len, score_len
  )
  return step


def _checked(
    memory: evaluation.EvalMemory,
    settings: Mapping[str, Sequence[float]] | None,
    long_sizes: Sequence[int],
    long_span: str,
) -> tuple[dict[str, tuple[float, ...]], tuple[int, ...]]:
  """``make_eval_step``'s axis values and memory sizes, checked, as tuples."""
  settings = {k: tuple(v) for k, v in (settings or {}).items()}
  long_sizes = tuple(int(n) for n in long_sizes)
  if any(n < 0 for n in long_sizes):
    raise errors.ConfigError(
        f"long-term memory sizes must be >= 0, got {long_sizes}"
    )
  memory.check(settings)
  evaluation.long_memory_end(0, 0, long_span)  # checks the name
  return settings, long_sizes


def _forward(
    model: Any, params: Any, batch: dict[str, Array], score_len: int
) -> tuple[evaluation.Queries, Array, dict[str, Array], Array]:
  """The model on a batch of W windows: (the S scored queries of each, g
  [W, T, D] of every position, the plain outputs ('lm' [W, S] log p, 0 where
  not scored; 'weights', 'targets', 'positions' [W, S]), log Z [W, S])."""
  out = model.apply(
      model_vars.as_variables(params),
      batch["inputs"],
      batch["targets"],
      deterministic=True,
  )
  q = evaluation.scored_queries(out.features, batch, score_len)
  take = lambda x: evaluation.take_scored(x, batch["score_from"], score_len)  # noqa: E731
  weights = q.positions >= 0
  lm = take(out.target_logprob).astype(jnp.float32)
  result = {
      "lm": jnp.where(weights, lm, 0.0),
      "weights": weights.astype(jnp.float32),
      "targets": q.targets,
      "positions": q.positions,
  }
  return q, out.features, result, take(out.log_z).astype(jnp.float32)


def _memory_sums(
    q: evaluation.Queries,
    g: Array,
    batch: dict[str, Array],
    bank: Bank,
    scales: Array,
    long_sizes: Sequence[int],
    context: int,
    block_size: int | None,
    long_span: str,
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
      long_span: which N pairs M_long holds (``evaluation.LONG_SPANS``).
  """
  key_valid = batch["position"] >= 0
  loc_all, loc_pos = evaluation.local_sums(
      q.g, q.offsets, q.targets, g, batch["targets"], key_valid, scales
  )  # [G, W, S]
  flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
  ends = evaluation.long_memory_end(
      batch["start"], batch["score_from"], long_span
  )
  starts = jnp.broadcast_to(ends[:, None], q.positions.shape)
  per_size = []
  for n in long_sizes:
    if n == 0:
      per_size.append((loc_all, loc_pos))
      continue
    keep = n + context
    l_all, l_pos = evaluation.long_sums(
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
