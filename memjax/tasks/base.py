"""Training tasks: what a run learns from and how it is scored.

The loop (``memjax.run.loop``) and ``--mode=eval`` ask the run's task
(``settings.task``, a name the engine's spec or a method declares) for
everything that depends on the kind of data: checking and reading the
data, the vocabulary the run saves, the tokens a step holds, and the
evaluation during and after training. A task is built once, with the
run's settings (``Task(settings)``), by ``memjax.build``. Language
modelling (``lm``, ``memjax.tasks.lm``) reads a corpus as token streams and
scores perplexity or bits per character; another task (translation, masked
LM, classification) declares its own and trains through the same loop,
batcher, objective, checkpoints and step hooks.
"""

from __future__ import annotations

import abc
from typing import Any

from jax.sharding import Mesh

from memjax import settings as settings_lib
from memjax import sharding
from memjax.checkpoints import runfiles
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


class Task(abc.ABC):
  """One kind of training data and its evaluation.

  Attributes:
    settings: the run's settings.
  """

  def __init__(self, settings: settings_lib.Settings):
    self.settings = settings

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
