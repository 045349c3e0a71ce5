"""Sliding-window scoring of a model without recurrent memory.

The protocol is Baevski & Auli's (TRIME paper, App. D): fixed-length windows
slide over the split's token stream; only the last ``score_len`` predictions
of a window are scored, the rest is context, and every prediction is scored
exactly once (``memjax.data.windows.eval_windows``).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from memjax.models import variables as model_vars
from memjax.data import windows
from memjax.eval import rows


class WindowScorer(rows.Scorer):
  """Scores streams in the windows of ``eval.window_len`` / ``score_len``."""

  def __init__(
      self,
      scoring: rows.Scoring,
      *,
      window_len: Optional[int] = None,
      score_len: Optional[int] = None,
      batch_size: Optional[int] = None,
  ) -> None:
    """Creates the scorer.

    Args:
      scoring: the model and its settings (``rows.Scoring``).
      window_len: tokens per window (default ``eval.window_len``).
      score_len: scored predictions per window (``eval.score_len``).
      batch_size: windows per batch (``eval.batch_size``), rounded up to
        the data-parallel devices.
    """
    super().__init__(scoring)
    e = scoring.eval
    self.window_len = int(window_len or e.window_len)
    self.score_len = int(score_len or e.score_len)
    self.batch_size = rows.batch_rows(batch_size or e.batch_size, self.mesh)

  def stream_sums(
      self, params: Any, tokens: np.ndarray, max_items: int, desc: str
  ) -> tuple[float, float, dict[str, Any]]:
    """The stream's sums over its first ``max_items`` windows (0 = all)."""
    del desc
    t, s = self.window_len, self.score_len
    tokens = windows.truncate_windows(np.asarray(tokens), t, s, max_items)
    batches = windows.eval_batches(
        tokens, t, s, self.batch_size, self.scoring.window_bos
    )
    out = self.apply(
        params,
        ((b, self.batch_size) for b in batches),
        collections=(model_vars.COLLECTION,),
    )
    return (
        float(out.get("nll_sum", 0.0)),
        float(out.get("tokens", 0.0)),
        model_vars.flatten(out[model_vars.COLLECTION]),
    )

  def document_logprobs(
      self,
      params: Any,
      tokens: np.ndarray,
      spans: np.ndarray,
      max_items: int = 0,
  ) -> list[np.ndarray]:
    """Per document, log p of its tokens after its first, in windows inside
    the document (``data.windows.document_windows``); ``max_items`` keeps
    the first that many windows of all the documents."""
    batch = windows.document_windows(
        np.asarray(tokens),
        spans,
        self.window_len,
        self.score_len,
        self.scoring.window_bos,
    )
    if max_items:
      batch = {k: v[:max_items] for k, v in batch.items()}
    out = self.rows(
        params, batch, batch_size=self.batch_size, keep=("target_logprob",)
    )
    logp = out.get("target_logprob", np.zeros((0, self.window_len)))
    scored = batch["weights"] > 0
    doc = np.broadcast_to(batch["document"][:, None], scored.shape)[scored]
    flat = np.asarray(logp, np.float32)[scored]
    return [flat[doc == d] for d in range(len(spans))]

  def stream_logprobs(self, params: Any, tokens: np.ndarray) -> np.ndarray:
    """[N - 1] log p of a stream [N] after its first token."""
    spans = np.asarray([[0, len(tokens)]], np.int64)
    if len(tokens) < 2:
      return np.zeros(0, np.float32)
    return self.document_logprobs(params, tokens, spans)[0]
