"""Scoring token streams with testing memories, a grid of settings per pass.

``MemoryScorer`` scores a stream with every setting of a ``Grid`` (the
memory kind, long-term memory sizes, the values of the kind's axes) in one
pass over sliding windows (``memory_step.make_eval_step``); a kind with an
external memory searches its datastore on the host between two jitted
steps (``memjax/eval/external.py``). The modes built on it (memeval,
tune, memsweep, buckets) are in ``memjax/modes/memory_eval.py``.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import sharding as sharding_lib
from memjax.data import windows
from memjax.eval import external as external_lib
from memjax.eval import grid as grid_lib
from memjax.eval import memory_step
from memjax.eval import metrics
from memjax.eval import rows
from memjax.io import console
from memjax.memory import evaluation

Grid = grid_lib.Grid

# ----------------------------------------------------------------------------
# Scoring a stream
# ----------------------------------------------------------------------------


class MemoryScorer(rows.Scorer):
  """Scores streams with every setting of a grid in one pass."""

  def __init__(
      self,
      scoring: rows.Scoring,
      grid: Grid,
      *,
      external: Any = None,
      workdir: str = "",
      window_len: Optional[int] = None,
      score_len: Optional[int] = None,
      batch_size: Optional[int] = None,
      block_size: Optional[int] = -1,
      long_span: Optional[str] = None,
  ) -> None:
    """Creates the scorer.

    Args:
      scoring: the model and its settings (``rows.Scoring``; for a kind
        with an external memory, a restored run's, with its signature,
        path and step).
      grid: the settings.
      external: the kind's ``external.ExternalSearch``; None: opened from
        the run's datastore on first use (kinds that read one).
      workdir: where the run's datastore is (``external.datastore_path``).
      window_len: T (default ``eval.window_len``).
      score_len: S (default ``eval.score_len``).
      batch_size: windows per batch (default ``eval_memory.batch_size``),
        rounded up to the data-parallel devices.
      block_size: blockwise block of the long-memory sums (None: dense;
        default ``eval_memory.block_size``).
      long_span: which N pairs M_long holds (``evaluation.LONG_SPANS``;
        default ``eval_memory.long_mem_span``).
    """
    super().__init__(scoring)
    e, em = scoring.eval, scoring.memory  # Read only for what is not given.
    self.grid = grid
    self.window_len = int(window_len or e.window_len)
    self.score_len = int(score_len or e.score_len)
    size = batch_size or em.batch_size
    self.batch_size = rows.batch_rows(size, self.mesh)
    if block_size == -1:
      block_size = int(em.block_size) or None
    self.block_size = block_size
    self.long_span = long_span or em.long_mem_span
    self._external = external
    self._workdir = workdir

  @property
  def external(self) -> Any:
    """The external memory of a kind that reads one (else None)."""
    metric = self.grid.memory.external_metric
    if metric and self._external is None:
      self._external = external_lib.external_search(
          self.scoring, metric, self._workdir
      )
    return self._external

  def _fns(self, keep_tokens: bool) -> tuple[Any, Any]:
    """The evaluation step and its jitted per-batch sums
    (params, bank, batch) -> (bank, sums); the sums are unused for a kind
    with an external memory (``external.run_stream`` jits the step)."""
    key = ("grid", keep_tokens)
    if key not in self.compiled:
      step = memory_step.make_eval_step(
          self.model,
          window_len=self.window_len,
          score_len=self.score_len,
          kind=self.grid.kind,
          memory=self.grid.memory,
          long_sizes=self.grid.long_sizes,
          settings=self.grid.values(),
          block_size=self.block_size,
          long_span=self.long_span,
      )
      fn = sharding_lib.jit(
          _reduced(step, self.grid, keep_tokens),
          self.mesh,
          donate_argnums=(1,),
      )
      self.compiled[key] = (step, fn)
    return self.compiled[key]

  def score_grid(
      self,
      params: Any,
      tokens: np.ndarray,
      *,
      max_items: int = 0,
      keep_tokens: bool = False,
      desc: str = "memory eval",
  ) -> dict[str, Any]:
    """Scores a token stream [N] with every setting of the grid.

    Args:
      params: the parameters.
      tokens: [N] int token stream.
      max_items: only the first this many windows of ``eval_windows``
        (0 = all).
      keep_tokens: also return per-prediction log-probabilities.
      desc: name for the progress lines.

    Returns:
      {'plain': summary without memory, 'grid': [setting + summary, ...]}
      where a summary is {'nll', 'tokens', 'ppl' | 'bpc'}; with keep_tokens
      also 'positions', 'targets' [P], 'lm_logprob' [P] and 'grid_logprob'
      [G, P] in stream order.
    """
    t, s = self.window_len, self.score_len
    tokens = windows.truncate_windows(np.asarray(tokens), t, s, max_items)
    step, fn = self._fns(keep_tokens)
    memory = self.grid.memory
    if memory.external_metric:
      if self.external is None:
        raise errors.ConfigError(
            f"{self.grid.kind} evaluation needs a datastore"
        )
      fetched, start = external_lib.run_stream(
          self, step, params, tokens, keep_tokens=keep_tokens, desc=desc
      )
    else:
      fetched, start = self._run(fn, step.capacity, params, tokens, desc)
    return summarize_stream(
        fetched,
        self.grid,
        self.unit,
        keep_tokens,
        desc,
        start,
        self.scoring.memories,
    )

  def _run(
      self, fn: Any, capacity: int, params: Any, tokens: np.ndarray, desc: str
  ) -> tuple[list[dict[str, Any]], float]:
    """The per-batch sums of ``fn`` over the stream, and the start time."""
    bank = evaluation.init_bank(capacity, self.model.cfg.d_model)
    num_windows = len(
        windows.memory_eval_windows(
            max(len(tokens) - 1, 0), self.window_len, self.score_len
        )
    )
    num_batches = -(-num_windows // self.batch_size)
    start = last_report = time.time()
    pending = []
    batches = windows.memory_eval_batches(
        tokens,
        self.window_len,
        self.score_len,
        self.batch_size,
        self.scoring.window_bos,
    )
    for i, batch in enumerate(batches):
      batch = sharding_lib.put_global_batch(batch, self.mesh)
      bank, res = fn(params, bank, batch)
      pending.append(res)
      if time.time() - last_report > 30 and i + 1 < num_batches:
        jax.block_until_ready(res)
        last_report = time.time()
        console.info(
            "%s: batch %d/%d, %.0fs",
            desc,
            i + 1,
            num_batches,
            last_report - start,
        )
    return jax.device_get(pending), start

  def score(
      self,
      params: Any,
      tokens: np.ndarray,
      max_items: int = 0,
      desc: str = "memory eval",
  ) -> dict[str, float]:
    """The summary of the grid's first setting (the plain model's for a
    kind without memory)."""
    r = self.score_grid(params, tokens, max_items=max_items, desc=desc)
    return r["grid"][0] if r.get("grid") else r["plain"]

  def stream_logprobs(self, params: Any, tokens: np.ndarray) -> np.ndarray:
    """[N - 1] log p of a stream [N] at the grid's first setting."""
    if len(tokens) < 2:
      return np.zeros(0, np.float32)
    r = self.score_grid(params, tokens, keep_tokens=True, desc="")
    lp = r["grid_logprob"][0] if "grid_logprob" in r else r["lm_logprob"]
    return np.asarray(lp, np.float32)


def _reduced(step: Any, grid: Grid, keep_tokens: bool) -> Any:
  """(params, bank, batch) -> (bank, per-batch sums) of ``step``."""
  num_points = len(grid.points())

  def reduced(params, bank, batch):
    bank, out = step(params, bank, batch)
    w = out["weights"]
    res = {"lm": -jnp.sum(out["lm"] * w), "tokens": jnp.sum(w)}
    if num_points:
      logp = out[grid.kind].reshape((num_points,) + w.shape)
      res["grid"] = -jnp.sum(logp * w, axis=(1, 2))
      if keep_tokens:
        res["grid_tok"] = logp
    if keep_tokens:
      res.update(
          lm_tok=out["lm"],
          w_tok=w,
          tgt_tok=out["targets"],
          pos_tok=out["positions"],
      )
    return bank, res

  return reduced


def summarize_stream(
    fetched: list[dict[str, Any]],
    grid: Grid,
    unit: str,
    keep_tokens: bool,
    desc: str,
    start: float,
    memories: Optional[grid_lib.Memories] = None,
) -> dict[str, Any]:
  """``score_grid``'s results from its per-batch sums (host arrays)."""
  count = float(sum(r["tokens"] for r in fetched))
  out: dict[str, Any] = {
      "plain": metrics.summarize(
          float(sum(r["lm"] for r in fetched)), count, unit
      )
  }
  points = grid.points()
  if points:
    sums = np.sum([r["grid"] for r in fetched], axis=0)
    out["grid"] = [
        dict(p, **metrics.summarize(float(s), count, unit))
        for p, s in zip(points, sums)
    ]
  if keep_tokens:
    out.update(_tokens_in_order(fetched, len(points)))
  if not desc:  # A caller's own scoring (memjax.load(...).score): quiet.
    return out
  # "best" only where there was a choice: one setting is just "with it".
  best = min(out.get("grid", []), key=lambda r: r["nll"], default=None)
  which = "best" if len(points) > 1 else "with memory"
  console.info(
      "%s: %d predictions, %d settings in %.1fs; plain %s=%.4f%s",
      desc,
      int(count),
      len(points),
      time.time() - start,
      unit,
      out["plain"][unit],
      f", {which} {unit}={best[unit]:.4f} at {_setting(best, grid, memories)}"
      if best
      else "",
  )
  return out


def _tokens_in_order(
    fetched: list[dict[str, Any]], num_points: int
) -> dict[str, np.ndarray]:
  """The scored predictions' positions, targets and log-probabilities in
  stream order."""
  cat = lambda k: np.concatenate([r[k].reshape(-1) for r in fetched])  # noqa: E731
  w = cat("w_tok") > 0
  pos = cat("pos_tok")[w]
  order = np.argsort(pos, kind="stable")
  out = {
      "positions": pos[order],
      "targets": cat("tgt_tok")[w][order],
      "lm_logprob": cat("lm_tok")[w][order],
  }
  if num_points:
    g = np.concatenate(
        [r["grid_tok"].reshape(num_points, -1) for r in fetched], axis=1
    )
    out["grid_logprob"] = g[:, w][:, order]
  return out


def _setting(r: dict[str, Any], grid: Grid, memories: Any) -> str:
  """A result's settings in words (the grid's own keys without memories)."""
  if memories is not None:
    return grid_lib.setting_str(r, memories)
  keys = grid.axes()
  return ", ".join(f"{k}={r[k]:g}" for k in keys if k in r)
