"""The Python API: load any trained run or export, train from Python.

    import memjax
    lm = memjax.load("runs/demo/trimelm")       # a workdir or an export
    lm.score(["the cat sat", "on the mat"])     # log-probs, ppl
    lm.generate(["the history of", "in 1990"], num_tokens=30)
    mt = memjax.load("runs/demo_mt")            # a translation run
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

from memjax import build

from memjax import dispatch
from memjax.api.base import export
from memjax.api.encoder import Classifier
from memjax.api.encoder import MaskedLM
from memjax.api.lm import LanguageModel
from memjax.api.lm import memory_setting
from memjax.api.translator import Translator
from memjax.checkpoints import runfiles
from memjax.io import workdirs
from memjax.run import restore

__all__ = [
    "Classifier",
    "LanguageModel",
    "MaskedLM",
    "Translator",
    "export",
    "load",
    "memory_setting",
    "train",
]

# The API object of each task (``config.task``).
KINDS = {
    "lm": LanguageModel,
    "translation": Translator,
    "mlm": MaskedLM,
    "classification": Classifier,
}


def load(
    path: str,
    step: Optional[int] = None,
    *,
    mesh: Optional[dict[str, int]] = None,
) -> Any:
  """Restores a training workdir or an export as the object of its kind.

  Args:
    path: a workdir (``config.json`` + ``checkpoints/``) or an export.
    step: the checkpoint step of a workdir (None = the parameters the run's
      task chose: the latest, or for a classification run those of its best
      dev accuracy, ``<workdir>/best_dev``).
    mesh: mesh axis sizes, e.g. {'data': 8} (default: all devices, data).

  Returns:
    A ``LanguageModel``, ``Translator``, ``MaskedLM`` or ``Classifier``.
  """
  # A bucket that does not answer (no credentials, no network) is one line
  # within the probe's timeout, not minutes of the backend's retries.
  workdirs.check_workdir(path, name="memjax.load")
  files = runfiles.find(path)
  run = build.build(
      dispatch.saved_config(files.path),
      files.path,
      mesh=mesh or {"data": -1, "fsdp": 1, "tensor": 1},
  )
  cls = KINDS.get(run.settings.task)
  if cls is None:
    raise ValueError(
        f"memjax.load serves tasks {sorted(KINDS)}, not {run.settings.task!r}"
    )
  if step is None:
    files = run.task.chosen(files)
  return cls(restore.restore(run, files, step=step))


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
  return dispatch.run_mode("train", config, workdir)
