"""What every object ``memjax.load`` returns has: the run, its export."""

from __future__ import annotations

from typing import Optional

from memjax import experiment


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
    from memjax import api  # pylint: disable=g-import-not-at-top

    if self.restored.kind != "run":
      raise ValueError("this model was loaded from an export already")
    return api.export(self.restored.path, out_dir, dtype=dtype, step=self.step)

  def __repr__(self) -> str:
    r = self.restored
    return (
        f"{type(self).__name__}({r.kind} {r.path}, step {r.step}, "
        f"{self.config.model.family}, vocab {r.vocab_size})"
    )
