"""Language modelling: a corpus read as token streams, scored in perplexity
(words) or bits per character (bytes).

The built-in task (``config.task = 'lm'``): data from ``memjax.corpus``
(SeqIO tasks over the corpus files, cached token streams), evaluation from
``memjax.eval.scorer`` (sliding windows, or whole streams with the memory
carried for recurrent models), and the add-one unigram floor beside the
final results.
"""

from __future__ import annotations

from typing import Any

import ml_collections
from jax.sharding import Mesh

from memjax import corpus as corpus_lib
from memjax import registry
from memjax.eval import scorer as scoring
from memjax import task
from memjax.data import sources


class _SplitsEvaluator(task.Evaluator):
  """``scoring.SplitEvaluator`` over the corpus's evaluation splits."""

  def __init__(self, evaluator: scoring.SplitEvaluator, splits: dict):
    self._evaluator = evaluator
    self._splits = splits

  def run(self, params, step, max_items, prefix="", writer=None):
    return self._evaluator.run(
        params, self._splits, step, max_items, prefix, writer
    )


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
    return _SplitsEvaluator(
        scoring.SplitEvaluator(config, model, mesh, data.unit), data.splits
    )

  def final_results(
      self, config, model, params, mesh, data, step, writer=None
  ) -> dict[str, Any]:
    return scoring.final_results(
        config, model, params, mesh, data, step, writer
    )
