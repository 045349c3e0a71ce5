"""Scoring evaluation splits the way each model is meant to be scored.

Models without recurrent memory: sliding windows (``memjax.eval.windows``).
Models that carry memory: whole streams in lanes with the memory carried
(``memjax.eval.streams``). Used by the training loop (periodic and final
evaluation) and by ``--mode=eval`` (``memjax/modes/evaluation.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.sharding import Mesh

from memjax.eval import windows as evaluate
from memjax.eval import streams as recurrent_eval
from memjax import sharding as sharding_lib


class SplitEvaluator:
  """Scores evaluation splits the way a model is meant to be scored.

  Models without memory: sliding windows (``eval.window_len`` /
  ``eval.score_len``). Models that carry memory: whole streams in lanes with
  the memory carried (``memjax.eval.streams``). Compiles once; reuse it.
  """

  def __init__(self, config: Any, model: Any, mesh: Mesh, unit: str) -> None:
    self.config = config
    self.mesh = mesh
    self.unit = unit
    self._step = sharding_lib.under_mesh(evaluate.make_eval_step(model), mesh)
    self._stream = (
        recurrent_eval.evaluator_for(config, model, mesh)
        if model.carries_memory()
        else None
    )

  def score(
      self, params: Any, tokens: np.ndarray, max_windows: int, desc: str
  ) -> dict[str, float]:
    """{'nll', 'tokens', unit} of one token stream."""
    if self._stream is not None:
      return self._stream.evaluate(
          params, tokens, unit=self.unit, max_segments=max_windows, desc=desc
      )
    e = self.config.eval
    return evaluate.evaluate_tokens(
        self._step, params, tokens, window_len=e.window_len,
        score_len=e.score_len, batch_size=e.batch_size, mesh=self.mesh,
        unit=self.unit, max_windows=max_windows, desc=desc,
    )  # fmt: skip

  def run(
      self,
      params: Any,
      splits: dict[str, Any],
      step: int,
      max_windows: int,
      prefix: str = "",
      writer: Any = None,
  ) -> dict[str, dict[str, float]]:
    """Scores every split (``tasks.TokenStream``) and logs the metrics."""
    res = {}
    for split, stream in splits.items():
      desc = f"{prefix}{split} @ step {step}"
      r = self.score(params, stream.tokens, max_windows, desc)
      res[split] = r
      if writer is not None:
        writer.write_scalars(
            step,
            {f"{prefix}{split}/{k}": v for k, v in r.items() if k != "tokens"},
        )
    return res


def final_results(
    config: Any,
    model: Any,
    params: Any,
    mesh: Mesh,
    corpus: Any,
    step: int,
    writer: Any = None,
) -> dict[str, Any]:
  """Scores ``eval.splits`` and the add-one unigram floor beside them."""
  evaluator = SplitEvaluator(config, model, mesh, corpus.unit)
  results = {"name": config.name, "step": step, "unit": corpus.unit}
  results.update(
      evaluator.run(
          params, corpus.splits, step, int(config.eval.max_windows), "", writer
      )
  )
  for split, stream in corpus.splits.items():
    results.setdefault("unigram", {})[split] = evaluate.unigram_baseline(
        corpus.train.tokens, stream.tokens, corpus.vocab_size, corpus.unit
    )
  return results
