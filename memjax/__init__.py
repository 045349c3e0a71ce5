"""memjax: memory-augmented language models in JAX/Flax.

    import memjax
    model = memjax.load("runs/demo/trimelm")   # a workdir or an export
    model.score("some text")["ppl"]
    memjax.export("runs/demo/trimelm")

``load`` and ``export`` import the heavy modules on first use.
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
