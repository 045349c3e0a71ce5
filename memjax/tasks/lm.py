"""Language modelling: a corpus read as token streams, scored in perplexity
(words) or bits per character (bytes).

The built-in task (``config.task = 'lm'``): data from ``memjax.data.corpus``
(SeqIO tasks over the corpus files, cached token streams), evaluation by the
run's scorer (``memjax.eval.scorer_for``: sliding windows, or whole streams
with the memory carried for recurrent models), and the add-one unigram floor
beside the final results.
"""

from __future__ import annotations

from typing import Any

from memjax.data import corpus as corpus_lib
from memjax.data import sources
from memjax.eval import metrics
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.run import spec
from memjax.tasks import base as task


class SplitsEvaluator(task.Evaluator):
  """Scores the corpus's evaluation splits; compiles once, reuse it."""

  def __init__(self, scoring: rows.Scoring, data: corpus_lib.Corpus) -> None:
    self.scorer = scorer_lib.scorer_for(scoring)
    self.splits = data.splits

  def run(
      self,
      params: Any,
      step: int,
      max_items: int,
      prefix: str = "",
      writer: Any = None,
  ) -> dict[str, dict[str, float]]:
    """Scores every split (``tasks.TokenStream``) and logs the metrics."""
    res = {}
    for split, stream in self.splits.items():
      desc = f"{prefix}{split} @ step {step}"
      r = self.scorer.score(params, stream.tokens, max_items, desc)
      res[split] = r
      if writer is not None:
        writer.write_scalars(
            step,
            {f"{prefix}{split}/{k}": v for k, v in r.items() if k != "tokens"},
        )
    return res


class LanguageModelling(task.Task):
  """Next-token prediction over a corpus (``data.corpus``)."""

  def check_settings(self) -> None:
    sources.corpus_spec(self.settings.data.corpus)  # DataError if unknown.

  def check_data(self, train=True, workdir=""):
    s = self.settings
    corpus_lib.check_data(
        s.data, s.eval, tuple(s.eval.splits), train=train, workdir=workdir
    )

  def load(self, workdir, train=True) -> corpus_lib.Corpus:
    s = self.settings
    return corpus_lib.load_corpus(s.data, s.eval, workdir, train=train)

  def describe(self, data: corpus_lib.Corpus) -> str:
    splits = ", ".join(f"{k} {len(v.tokens)}" for k, v in data.splits.items())
    train = f", train {len(data.train.tokens)} tokens" if data.train else ""
    return f"corpus {data.name}: vocab {data.vocab_size}{train}, {splits}"

  def vocabulary(self, workdir) -> Any:
    return corpus_lib.vocabulary(self.settings.data, workdir)

  def tokens_per_step(self) -> int:
    d = self.settings.data
    return int(d.batch_size * d.seq_len)

  def evaluator(self, run: spec.Run, model, data) -> task.Evaluator:
    return SplitsEvaluator(run.scoring(model, unit=data.unit), data)

  def final_results(
      self, run: spec.Run, model, params, data, step, writer=None
  ) -> dict[str, Any]:
    """Scores ``eval.splits`` and the add-one unigram floor beside them."""
    s = self.settings
    results = {"name": s.name, "step": step, "unit": data.unit}
    evaluator = SplitsEvaluator(run.scoring(model, unit=data.unit), data)
    results.update(
        evaluator.run(params, step, int(s.eval.max_windows), "", writer)
    )
    for split, stream in data.splits.items():
      results.setdefault("unigram", {})[split] = metrics.unigram_baseline(
          data.train.tokens, stream.tokens, data.vocab_size, data.unit
      )
    return results
