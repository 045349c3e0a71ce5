"""memjax: memory-augmented language models in JAX/Flax.

    import memjax
    model = memjax.load("runs/demo/trimelm")   # a workdir or an export
    model.score("some text")["ppl"]
    memjax.export("runs/demo/trimelm")
    memjax.train(config, "runs/mine")          # as --mode=train
    memjax.run_mode("tune", config, "runs/x")  # any --mode, in process

``load`` returns the object of the run's kind (``LanguageModel``,
``Translator``, ``MaskedLM``, ``Classifier``; see ``memjax.api``). These
functions import the heavy modules on first use.
"""

from __future__ import annotations

from typing import Any, Optional


def load(
    path: str, step: Optional[int] = None, *, mesh: Optional[dict] = None
) -> Any:
  """Restores a training workdir or an export as the object of its kind.

  Args:
    path: a workdir (``config.json`` + ``checkpoints/``) or an export; a
      local path or a URL (``gs://...``).
    step: the checkpoint step of a workdir (None = the parameters the run's
      task chose: the latest readable, or for a classification run those of
      its best dev accuracy). A step that is not there is one error listing
      the steps that are.
    mesh: mesh axis sizes, e.g. {'data': 8} (default: all devices, data).

  Returns:
    A ``LanguageModel``, ``Translator``, ``MaskedLM`` or ``Classifier``
    (``memjax.api``).
  """
  from memjax import api  # pylint: disable=g-import-not-at-top

  return api.load(path, step, mesh=mesh)


def export(path: str, out_dir: Any = None, **kwargs) -> str:
  """``memjax.api.export``: writes a self-contained params-only export."""
  from memjax import api  # pylint: disable=g-import-not-at-top

  return api.export(path, out_dir, **kwargs)


def run_mode(name: str, config: Any, workdir: str) -> dict[str, Any]:
  """``memjax.api.run_mode``: runs ``--mode=name`` in this process."""
  from memjax import api  # pylint: disable=g-import-not-at-top

  return api.run_mode(name, config, workdir)


def train(config: Any, workdir: str) -> dict[str, Any]:
  """``memjax.api.train``: trains as ``--mode=train`` does."""
  from memjax import api  # pylint: disable=g-import-not-at-top

  return api.train(config, workdir)
