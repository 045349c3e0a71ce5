"""``--mode=export``: a params-only, self-contained copy of a run, in
memjax's format or (``export.format='hf'``, an imported model) as a
Hugging Face folder (``memjax.pretrained.to_hf``)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from memjax import errors
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
    format: memjax | hf: memjax's export (export.json, params/), or a
      Hugging Face folder (config.json, safetensors, tokenizer) of an
      imported model or one trained from it (docs/pretrained.md).
    hf_shard_mb: format 'hf': the most MB (10^6 bytes) of a safetensors
      file; larger checkpoints are sharded with an index.
  """

  SECTION: ClassVar[str] = "export"
  dir: str = ""
  dtype: str = "float32"
  format: str = "memjax"
  hf_shard_mb: float = 5000.0


# export.format's values.
FORMATS = ("memjax", "hf")


def export_run(run: spec.Run) -> dict[str, Any]:
  """Writes ``export.dir`` (default ``<workdir>/export``) in
  ``export.dtype`` and ``export.format``, with the run's ``tune.json``
  when it has one (memjax's format).

  Raises:
    errors.ConfigError: an unknown format or dtype, the directory exists,
      or (format 'hf') a model Hugging Face has no class for.
  """
  e = run.settings.of(Export)
  if e.format not in FORMATS:
    raise errors.ConfigError(
        f"export.format must be one of {list(FORMATS)}, got {e.format!r}"
    )
  out = paths.resolve(e.dir or paths.join(run.workdir, "export"))
  files = runfiles.find(run.workdir)
  if e.format == "hf":
    from memjax.pretrained import to_hf  # pylint: disable=g-import-not-at-top

    return to_hf.export_hf(run, files, out, e.dtype, e.hf_shard_mb)
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
