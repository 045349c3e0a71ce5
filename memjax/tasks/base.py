"""Training tasks: what a run learns from and how it is scored.

The loop (``memjax.train``) and ``--mode=eval`` ask the run's task
(``config.task``, a name in ``registry.TASKS``) for everything that depends
on the kind of data: checking and reading the data, the vocabulary the run
saves, the tokens a step holds, and the evaluation during and after
training. Language modelling (``lm``, ``memjax.tasks.lm``) reads a corpus as
token streams and scores perplexity or bits per character; another task
(translation, masked LM, classification) registers its own and trains
through the same loop, batcher, objective, checkpoints and step hooks.
"""

from __future__ import annotations

import abc
from typing import Any

import ml_collections
from jax.sharding import Mesh

from memjax import sharding


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
  """One kind of training data and its evaluation."""

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    """Raises ConfigError/DataError for settings this task cannot use."""
    del config

  def check_batch_fits(
      self, config: ml_collections.ConfigDict, mesh: Mesh
  ) -> None:
    """Raises MeshError/ConfigError for batches the mesh cannot split."""
    sharding.check_batch_fits(config, mesh)

  def data_settings(self, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Settings outside ``data.*`` that make the batches and the vocabulary
    of a run, by config key (``{'translation.max_tokens': 4096}``).

    Saved with every checkpoint; resuming with other values stops with a
    ResumeError naming them (``memjax.run.loop.check_position``).
    """
    del config
    return {}

  @abc.abstractmethod
  def check_data(
      self, config: ml_collections.ConfigDict, train: bool = True
  ) -> None:
    """Raises DataError for a missing or malformed data file; writes
    nothing."""

  @abc.abstractmethod
  def load(
      self, config: ml_collections.ConfigDict, workdir: str, train: bool = True
  ) -> Any:
    """The run's data: an object with ``vocab_size``, ``train`` (what the
    batcher reads; None when ``train`` is False) and ``cache_dir``."""

  @abc.abstractmethod
  def describe(self, data: Any) -> str:
    """One line about the data for the log."""

  @abc.abstractmethod
  def vocabulary(self, config: ml_collections.ConfigDict, workdir: str) -> Any:
    """The vocabulary ``runfiles.write_run_files`` saves with the run."""

  @abc.abstractmethod
  def tokens_per_step(self, config: ml_collections.ConfigDict) -> int:
    """Target tokens in one update (for throughput)."""

  @abc.abstractmethod
  def evaluator(
      self, config: ml_collections.ConfigDict, model: Any, mesh: Mesh, data: Any
  ) -> Evaluator:
    """The evaluation run during training (compiled once, reused)."""

  @abc.abstractmethod
  def final_results(
      self,
      config: ml_collections.ConfigDict,
      model: Any,
      params: Any,
      mesh: Mesh,
      data: Any,
      step: int,
      writer: Any = None,
  ) -> dict[str, Any]:
    """The results of the final model (written to ``results.json``)."""


def get(config: ml_collections.ConfigDict) -> Task:
  """The task of ``config.task`` (ConfigError listing the registered ones)."""
  from memjax import registry  # pylint: disable=g-import-not-at-top

  return registry.TASKS.get(config.get("task", "lm"))()
