"""The Python API: load any trained run or export, train from Python.

    import memjax
    lm = memjax.load("runs/demo/trimelm")       # a workdir or an export
    lm.score(["the cat sat", "on the mat"])     # log-probs, ppl
    lm.generate(["the history of", "in 1990"], num_tokens=30)
    mt = memjax.load("runs/demo_mt/vanilla")    # a translation run
    mt.translate(["ein Haus ."], beam=4)
    memjax.train(config, "runs/mine")           # as --mode=train
    memjax.run_mode("tune", config, "runs/mine")  # any --mode, in process

``load`` returns the object of the run's kind (``config.task``):

| task | object | what it does |
|---|---|---|
| lm | ``LanguageModel`` | ``score``, ``generate``, ``attach(datastore=)`` |
| translation | ``Translator`` | ``translate``, ``score(source, target)`` |
| mlm | ``MaskedLM`` | ``score`` (masked tokens), ``usage`` |
| classification | ``Classifier`` | ``predict``, ``usage`` by class |

Every object scores through ``memjax.eval`` (the scorer ``scorer_for``
picks, as the command line does) and keeps its compiled functions: inputs
are padded to a few shapes (windows, or power-of-two length buckets), so N
inputs compile once per shape, not N times.
"""

from __future__ import annotations

from typing import Any, Optional

from memjax.io import console
from memjax import experiment
from memjax.io import paths
from memjax.checkpoints import runfiles
from memjax.api.base import export
from memjax.api.encoder import Classifier
from memjax.api.encoder import MaskedLM
from memjax.api.lm import LanguageModel
from memjax.api.lm import memory_setting
from memjax.api.translator import Translator

__all__ = [
    "Classifier",
    "LanguageModel",
    "MaskedLM",
    "Translator",
    "export",
    "export_run",
    "load",
    "memory_setting",
    "run_mode",
    "train",
]

# The API object of each task (``config.task``).
KINDS = {
    "lm": LanguageModel,
    "translation": Translator,
    "mlm": MaskedLM,
    "classification": Classifier,
}
# Where a classification run keeps the parameters of its best dev accuracy
# (``memjax.tasks.classification.BEST_DIR``).
_BEST_DIR = "best_dev"


def load(
    path: str,
    step: Optional[int] = None,
    *,
    mesh: Optional[dict[str, int]] = None,
) -> Any:
  """Restores a training workdir or an export as the object of its kind.

  Args:
    path: a workdir (``config.json`` + ``checkpoints/``) or an export.
    step: the checkpoint step of a workdir (None = latest; a classification
      run without a step gives the parameters of its best dev accuracy,
      ``<workdir>/best_dev``, which the run chose).
    mesh: mesh axis sizes, e.g. {'data': 8} (default: all devices, data).

  Returns:
    A ``LanguageModel``, ``Translator``, ``MaskedLM`` or ``Classifier``.
  """
  best = paths.join(paths.resolve(path), _BEST_DIR)
  files = runfiles.find(path)
  task = runfiles.read_config(files).get("task", "lm")
  if task == "classification" and step is None and files.kind == "run":
    if paths.isfile(paths.join(best, runfiles.EXPORT_FILE)):
      path = best
  cls = KINDS.get(task)
  if cls is None:
    raise ValueError(f"memjax.load serves tasks {sorted(KINDS)}, not {task!r}")
  return cls(experiment.load(path, step=step, mesh=mesh))


def export_run(config: Any, workdir: str) -> dict[str, Any]:
  """``--mode=export``: writes ``export.dir`` (default ``<workdir>/export``)."""
  out = export(workdir, config.export.dir or None, dtype=config.export.dtype)
  meta = runfiles.RunFiles("export", out).read_json(runfiles.EXPORT_FILE)
  size = paths.du(out)
  line = (
      f"exported step {meta['step']} ({meta['num_params']:,} parameters, "
      f"{meta['dtype']}) to {out}: {size / 2**20:.1f} MiB"
  )
  console.info("%s", line)
  return {"summary_lines": [line], "results_path": out, "export": out}


def train(config: Any, workdir: str) -> dict[str, Any]:
  """Trains ``config`` into ``workdir`` as ``--mode=train`` does (resuming
  from the workdir's latest checkpoint) and returns the final results.

  Args:
    config: an experiment config (``configs/<exp>.py``'s ``get_config``).
    workdir: the run's directory (a local path or a URL).

  Raises:
    errors.UserError: bad input (one line naming what to fix), before
      anything is written.
  """
  from memjax.run import loop as train_lib  # pylint: disable=g-import-not-at-top

  paths.check_workdir(workdir)
  runfiles.check_workdir(workdir, training=True)
  return train_lib.train_and_evaluate(config, workdir)


def run_mode(name: str, config: Any, workdir: str) -> dict[str, Any]:
  """Runs ``--mode=name`` in this process, as ``memjax.main`` runs it.

  Args:
    name: a mode of ``registry.MODES`` (``--mode=list`` shows them).
    config: the config the mode reads (e.g. ``train.init_from`` naming the
      run to evaluate).
    workdir: where the mode reads the run and writes its results.

  Returns:
    The mode's results dict.

  Raises:
    errors.UserError: an unknown mode, a run of a kind the mode does not
      take, or other bad input (one line naming what to fix).
  """
  import importlib  # pylint: disable=g-import-not-at-top

  from memjax import registry  # pylint: disable=g-import-not-at-top

  mode = registry.MODES.get(name)
  paths.check_workdir(workdir)
  runfiles.check_workdir(workdir, training=name == "train")
  mode.check(name, config)
  module, fn = mode.run.split(":")
  return getattr(importlib.import_module(module), fn)(config, workdir)
