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

from typing import Any


def load(path: str, step: Any = None, **kwargs) -> Any:
  """``memjax.api.load``: restores a workdir or an export."""
  from memjax import api  # pylint: disable=g-import-not-at-top

  return api.load(path, step, **kwargs)


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
