"""``--mode=eval``: score a finished run or an export on ``eval.splits``."""

from __future__ import annotations

from typing import Any

import jax

from memjax.io import paths
from memjax.run import restore
from memjax.run import spec


def evaluate_run(run: spec.Run) -> dict[str, Any]:
  """``--mode=eval``: scores a finished run (or an export) on eval.splits.

  Restores the latest checkpoint of the workdir (or the export there, or
  the run of ``train.init_from`` when the workdir has none); the training
  batcher is never built. Writes ``<workdir>/results.json``.
  """
  restored = restore.restore_source(run)
  data = run.task.load(run.workdir)
  results = run.task.final_results(
      run, restored.model, restored.variables, data, restored.step
  )
  results["checkpoint"] = restored.path
  paths.makedirs(run.workdir)
  if jax.process_index() == 0:
    paths.write_json(paths.join(run.workdir, "results.json"), results)
  return results
