"""``--mode=eval``: score a finished run or an export on ``eval.splits``."""

from __future__ import annotations

from typing import Any

import jax

from memjax import experiment
from memjax.io import paths
from memjax.checkpoints import runfiles
from memjax.tasks import base as task_lib


def evaluate_run(config: Any, workdir: str) -> dict[str, Any]:
  """``--mode=eval``: scores a finished run (or an export) on eval.splits.

  Restores the latest checkpoint of ``workdir`` (or the export there, or the
  run of ``train.init_from`` when the workdir has none) through
  ``memjax.experiment.load``; the training batcher is never built. Writes
  ``<workdir>/results.json``.
  """
  restored = experiment.load(
      experiment.source_of(config, workdir), config=config
  )
  task = task_lib.get(config)
  data = task.load(config, workdir)
  results = task.final_results(
      config, restored.model, restored.variables, restored.mesh, data,
      restored.step,
  )  # fmt: skip
  results["checkpoint"] = restored.path
  paths.makedirs(workdir)
  if jax.process_index() == 0:
    runfiles.write_json(paths.join(workdir, "results.json"), results)
  return results
