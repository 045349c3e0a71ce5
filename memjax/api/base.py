"""What every object ``memjax.load`` returns has: the run, its export."""

from __future__ import annotations

from typing import Optional

from memjax import experiment
from memjax.io import paths


class Loaded:
  """A restored run or export.

  Attributes:
    restored: the underlying ``experiment.Restored`` (model, params, mesh).
    config: the run's config (``ml_collections.ConfigDict``).
    step: training step of the parameters.
    vocab: the run's vocabulary.
  """

  def __init__(self, restored: experiment.Restored):
    self.restored = restored
    self.config = restored.config
    self.step = restored.step
    self.vocab = restored.vocab

  def export(
      self, out_dir: Optional[str] = None, dtype: str = "float32"
  ) -> str:
    """Writes a self-contained export (see ``memjax.export``)."""
    if self.restored.kind != "run":
      raise ValueError("this model was loaded from an export already")
    return export(self.restored.path, out_dir, dtype=dtype, step=self.step)

  def __repr__(self) -> str:
    r = self.restored
    return (
        f"{type(self).__name__}({r.kind} {r.path}, step {r.step}, "
        f"{self.config.model.family}, vocab {r.vocab_size})"
    )


def export(
    path: str,
    out_dir: Optional[str] = None,
    *,
    dtype: str = "float32",
    step: Optional[int] = None,
) -> str:
  """Writes ``path``'s parameters, config, vocabulary, signature and tuned
  memory setting to ``out_dir`` (default ``<workdir>/export``)."""
  out = experiment.export(path, out_dir, step=step, dtype=dtype)
  tuned = paths.join(path, "tune.json")
  if paths.isfile(tuned):
    paths.copy(tuned, paths.join(out, "tune.json"))
  return out
