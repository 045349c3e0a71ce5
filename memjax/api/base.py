"""What every object ``memjax.load`` returns has: the run, its export."""

from __future__ import annotations

from typing import Any, Optional

from memjax import dispatch
from memjax import config as config_lib
from memjax.io import paths
from memjax.run import restore


class Loaded:
  """A restored run or export.

  Attributes:
    restored: the underlying ``memjax.run.restore.Restored`` (model,
      params, mesh, run).
    settings: the run's settings (``memjax.settings.Settings``).
    config: the run's config (``ml_collections.ConfigDict``), as saved.
    step: training step of the parameters.
    vocab: the run's vocabulary.
  """

  def __init__(self, restored: restore.Restored):
    self.restored = restored
    self.settings = restored.settings
    self.config = config_lib.from_json(restored.run.config_json)
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
        f"{self.settings.model.family}, vocab {r.vocab_size})"
    )


def export(
    path: str,
    out_dir: Optional[str] = None,
    *,
    dtype: str = "float32",
    step: Optional[int] = None,
) -> str:
  """Writes ``path``'s parameters, config, vocabulary, signature and tuned
  memory setting to ``out_dir`` (default ``<workdir>/export``).

  Raises:
    errors.ConfigError: a bad dtype, or ``out_dir`` exists.
  """
  out_dir = paths.resolve(out_dir or paths.join(path, "export"))
  restored = dispatch.restore(
      path, step, mesh={"data": -1, "fsdp": 1, "tensor": 1}
  )
  out = restore.export(restored, out_dir, dtype=dtype)
  tuned = paths.join(path, "tune.json")
  if paths.isfile(tuned):
    paths.copy(tuned, paths.join(out, "tune.json"))
  return out


def loaded_kind(restored: Any) -> str:
  """The run's kind, ``'<task>/<model.family>'``."""
  return restored.run.kind
