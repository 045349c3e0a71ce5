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

import ml_collections
from jax.sharding import Mesh

from memjax.data import corpus as corpus_lib
from memjax import registry
from memjax.tasks import base as task
from memjax.data import sources
from memjax.eval import metrics
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib


class SplitsEvaluator(task.Evaluator):
  """Scores the corpus's evaluation splits; compiles once, reuse it."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      model: Any,
      mesh: Mesh,
      data: corpus_lib.Corpus,
  ) -> None:
    self.scorer = scorer_lib.scorer_for(
        rows.RunView(config, model, mesh, data.unit)
    )
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


@registry.TASKS.register("lm")
class LanguageModelling(task.Task):
  """Next-token prediction over a corpus (``data.corpus``)."""

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    sources.corpus_spec(config.data.corpus)  # DataError for an unknown one.

  def check_data(self, config, train=True):
    corpus_lib.check_data(config, tuple(config.eval.splits), train=train)

  def load(self, config, workdir, train=True) -> corpus_lib.Corpus:
    return corpus_lib.load_corpus(config, workdir, train=train)

  def describe(self, data: corpus_lib.Corpus) -> str:
    splits = ", ".join(f"{k} {len(v.tokens)}" for k, v in data.splits.items())
    train = f", train {len(data.train.tokens)} tokens" if data.train else ""
    return f"corpus {data.name}: vocab {data.vocab_size}{train}, {splits}"

  def vocabulary(self, config, workdir) -> Any:
    return corpus_lib.vocabulary(config, workdir)

  def tokens_per_step(self, config) -> int:
    return int(config.data.batch_size * config.data.seq_len)

  def evaluator(self, config, model, mesh: Mesh, data) -> task.Evaluator:
    return SplitsEvaluator(config, model, mesh, data)

  def final_results(
      self, config, model, params, mesh, data, step, writer=None
  ) -> dict[str, Any]:
    """Scores ``eval.splits`` and the add-one unigram floor beside them."""
    results = {"name": config.name, "step": step, "unit": data.unit}
    results.update(
        SplitsEvaluator(config, model, mesh, data).run(
            params, step, int(config.eval.max_windows), "", writer
        )
    )
    for split, stream in data.splits.items():
      results.setdefault("unigram", {})[split] = metrics.unigram_baseline(
          data.train.tokens, stream.tokens, data.vocab_size, data.unit
      )
    return results
