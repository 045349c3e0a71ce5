"""Training tasks: what a run learns from and how it is scored.

The loop (``memjax.run.loop``) and ``--mode=eval`` ask the run's task
(``settings.task``, a name the engine's spec or a method declares) for
everything that depends on the kind of data: checking and reading the
data, the vocabulary the run saves, the tokens a step holds, and the
evaluation during and after training. A task is built once, with the
run's settings (``Task(settings)``), by ``memjax.build``.

The built-in task, language modelling (``config.task = 'lm'``,
``LanguageModelling`` below), reads a corpus as token streams (SeqIO tasks
over the corpus files, cached token streams: ``memjax.data.corpus``) and
scores perplexity (words) or bits per character (bytes) with the run's
scorer (``memjax.eval.scorer_for``: sliding windows, or whole streams with
the memory carried for recurrent models), with the add-one unigram floor
beside the final results. Another task (translation, masked LM,
classification) declares its own and trains through the same loop, batcher,
objective, checkpoints and step hooks.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

from jax.sharding import Mesh

from memjax import settings as settings_lib
from memjax import sharding
from memjax.checkpoints import runfiles
from memjax.data import corpus as corpus_lib
from memjax.data import sources
from memjax.eval import metrics
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.run import spec


class Evaluator(abc.ABC):
  """Scores the evaluation splits of a task with given parameters."""

  @abc.abstractmethod
  def run(
      self,
      params: Any,
      step: int,
      max_items: int,
      prefix: str = "",
      writer: Any = None,
  ) -> dict[str, dict[str, float]]:
    """{split: metrics}, logged to ``writer`` as ``<prefix><split>/<name>``.

    ``max_items`` bounds the work per split (windows, segments or
    sentences; 0 = all).
    """


@dataclasses.dataclass(eq=False)
class Task(abc.ABC):
  """One kind of training data and its evaluation.

  Attributes:
    settings: the run's settings.
  """

  settings: settings_lib.Settings

  def check_settings(self) -> None:
    """Raises ConfigError/DataError for settings this task cannot use."""

  def check_batch_fits(self, mesh: Mesh, carries_memory: bool) -> None:
    """Raises MeshError/ConfigError for batches the mesh cannot split."""
    sharding.check_batch_fits(self.settings, carries_memory, mesh)

  def data_settings(self) -> dict[str, Any]:
    """Settings outside ``data.*`` that make the batches and the vocabulary
    of a run, by config key (``{'translation.max_tokens': 4096}``).

    Saved with every checkpoint; resuming with other values stops with a
    ResumeError naming them (``memjax.run.loop.check_position``).
    """
    return {}

  def chosen(self, files: runfiles.RunFiles) -> runfiles.RunFiles:
    """The parameters of the run or export at ``files`` that a trained run
    stands for (``memjax.load`` without a step): its latest by default."""
    return files

  @abc.abstractmethod
  def check_data(self, train: bool = True, workdir: str = "") -> None:
    """Raises DataError for a missing or malformed data file; writes
    nothing. A corpus file may be missing where the run's cache
    (``data.cache_dir``, else ``<workdir>/cache``) holds what is read from
    it."""

  @abc.abstractmethod
  def load(self, workdir: str, train: bool = True) -> Any:
    """The run's data: an object with ``vocab_size``, ``train`` (what the
    batcher reads; None when ``train`` is False) and ``cache_dir``."""

  @abc.abstractmethod
  def describe(self, data: Any) -> str:
    """One line about the data for the log."""

  @abc.abstractmethod
  def vocabulary(self, workdir: str) -> Any:
    """The vocabulary ``runfiles.write_run_files`` saves with the run."""

  @abc.abstractmethod
  def tokens_per_step(self) -> int:
    """Target tokens in one update (for throughput)."""

  @abc.abstractmethod
  def evaluator(self, run: spec.Run, model: Any, data: Any) -> Evaluator:
    """The evaluation run during training (compiled once, reused) of
    ``model`` on the run's mesh."""

  @abc.abstractmethod
  def final_results(
      self,
      run: spec.Run,
      model: Any,
      params: Any,
      data: Any,
      step: int,
      writer: Any = None,
  ) -> dict[str, Any]:
    """The results of the final model (written to ``results.json``)."""


class SplitsEvaluator(Evaluator):
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


class LanguageModelling(Task):
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

  def evaluator(self, run: spec.Run, model, data) -> Evaluator:
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
