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

# The API, imported on first use (``import memjax`` stays light): each name
# is the function itself, no layer in between.
_LAZY = {
    "load": "memjax.api",
    "export": "memjax.api",
    "train": "memjax.api",
    "run_mode": "memjax.dispatch",
}


def __getattr__(name: str) -> Any:
  """``memjax.load``, ``export``, ``train`` (``memjax.api``) and
  ``run_mode`` (``memjax.dispatch``), imported when first read."""
  if name not in _LAZY:
    raise AttributeError(f"module 'memjax' has no attribute {name!r}")
  import importlib  # pylint: disable=g-import-not-at-top

  return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
  return sorted(list(globals()) + list(_LAZY))
