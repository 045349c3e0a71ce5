"""``--mode=export``: a params-only, self-contained copy of a run."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from memjax.checkpoints import runfiles
from memjax.io import paths
from memjax.run import restore
from memjax.run import spec


@dataclasses.dataclass(frozen=True)
class Export:
  """``config.export``: --mode=export, a params-only, self-contained copy.

  Attributes:
    dir: '' = <workdir>/export.
    dtype: float32 | bfloat16.
  """

  SECTION: ClassVar[str] = "export"
  dir: str = ""
  dtype: str = "float32"


def export_run(run: spec.Run) -> dict[str, Any]:
  """Writes ``export.dir`` (default ``<workdir>/export``) in
  ``export.dtype``, with the run's ``tune.json`` when it has one."""
  e = run.settings.of(Export)
  out = paths.resolve(e.dir or paths.join(run.workdir, "export"))
  files = runfiles.find(run.workdir)
  restored = restore.restore(run, files)
  out = restore.export(
      restored,
      out,
      dtype=e.dtype,
      config_json=runfiles.read_config_text(files),
  )
  tuned = paths.join(run.workdir, "tune.json")
  if paths.isfile(tuned):
    paths.copy(tuned, paths.join(out, "tune.json"))
  meta = runfiles.RunFiles("export", out).read_json(runfiles.EXPORT_FILE)
  size = paths.du(out)
  line = (
      f"exported step {meta['step']} ({meta['num_params']:,} parameters, "
      f"{meta['dtype']}) to {out}: {size / 2**20:.1f} MiB"
  )
  # memjax.main prints the summary line (once).
  return {"summary_lines": [line], "results_path": out, "export": out}
