"""The files a run or an export keeps beside its arrays.

A workdir holds ``config.json`` (the whole config), ``vocab.json`` (which
vocabulary: ``{"kind": "words", "file": "vocab.txt"}`` or ``{"kind":
"bytes"}`` or ``"sentencepiece"``) with ``vocab.txt`` for word corpora
and ``spm.model`` for translation, and ``checkpoints/``. An
export holds the same two files, ``export.json`` and ``params/``. With these
a run is restored from its directory alone: no config file, flags or corpus
are needed to load it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import ml_collections

from memjax import config as config_lib
from memjax import errors

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
EXPORT_FILE = "export.json"
SPM_FILE = "spm.model"


def file_sha1(path: str) -> str:
  """The SHA-1 of a file's bytes (hex)."""
  import hashlib  # pylint: disable=g-import-not-at-top

  with open(path, "rb") as f:
    return hashlib.sha1(f.read()).hexdigest()


@dataclasses.dataclass(frozen=True)
class RunFiles:
  """Where a run's or an export's files are.

  Attributes:
    kind: 'run' or 'export'.
    path: the directory.
  """

  kind: str
  path: str

  @property
  def checkpoints(self) -> str:
    return os.path.join(self.path, "checkpoints")

  @property
  def params_dir(self) -> str:
    return os.path.join(self.path, "params")

  def read_json(self, name: str) -> dict[str, Any]:
    with open(os.path.join(self.path, name)) as f:
      return json.load(f)


def _has_steps(directory: str) -> bool:
  return os.path.isdir(directory) and any(
      s.isdigit() for s in os.listdir(directory)
  )


def find(path: str) -> RunFiles:
  """Identifies a workdir, its ``checkpoints`` folder, or an export.

  Raises:
    errors.MissingRunError: nothing restorable there.
  """
  path = os.path.abspath(path)
  if os.path.basename(path) == "checkpoints" and _has_steps(path):
    path = os.path.dirname(path)
  if os.path.isfile(os.path.join(path, EXPORT_FILE)):
    return RunFiles("export", path)
  if _has_steps(os.path.join(path, "checkpoints")):
    return RunFiles("run", path)
  raise errors.MissingRunError(
      f"{path} holds no trained run (no checkpoints/<step>) and no export "
      f"({EXPORT_FILE}): train first, or point at a run or export directory"
  )


def write_json(path: str, obj: Any) -> None:
  """Writes JSON atomically (temporary file, then rename)."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def write_table(workdir: str, table: dict[str, Any]) -> dict[str, Any]:
  """A demo's results: ``table`` as ``<workdir>/table.json`` and its
  ``markdown`` as ``table.md``; returns ``table``."""
  write_json(os.path.join(workdir, "table.json"), table)
  with open(os.path.join(workdir, "table.md"), "w") as f:
    f.write(table["markdown"] + "\n")
  return table


def config_to_json(config: ml_collections.ConfigDict) -> str:
  return config.to_json_best_effort(indent=2, sort_keys=True)


def _merge(base: ml_collections.ConfigDict, values: Mapping[str, Any]) -> None:
  for k, v in values.items():
    if k in base and isinstance(base[k], ml_collections.ConfigDict):
      if isinstance(v, Mapping):
        _merge(base[k], v)
        continue
    if k in base and isinstance(base[k], tuple) and isinstance(v, list):
      v = tuple(v)
    elif isinstance(v, Mapping):
      v = ml_collections.ConfigDict(v)
    with base.unlocked():
      if k in base and isinstance(base[k], float) and isinstance(v, int):
        v = float(v)
      base[k] = v


def config_from_json(text: str) -> ml_collections.ConfigDict:
  """A config saved by ``config_to_json``, with the base config's types."""
  config = config_lib.base_config()
  _merge(config, json.loads(text))
  config.lock()
  return config


def read_config(files: RunFiles) -> ml_collections.ConfigDict:
  """The config a run or export saved.

  Raises:
    errors.MissingRunError: the directory has no ``config.json``.
  """
  path = os.path.join(files.path, CONFIG_FILE)
  if not os.path.isfile(path):
    raise errors.MissingRunError(
        f"{files.path} has checkpoints but no {CONFIG_FILE}; pass the run's "
        "--config to restore it"
    )
  with open(path) as f:
    return config_from_json(f.read())


def write_run_files(
    directory: str, config: ml_collections.ConfigDict, vocab: Any
) -> None:
  """Writes ``config.json`` and the vocabulary files into ``directory``."""
  os.makedirs(directory, exist_ok=True)
  tmp = os.path.join(directory, CONFIG_FILE + ".tmp")
  with open(tmp, "w") as f:
    f.write(config_to_json(config))
  os.replace(tmp, os.path.join(directory, CONFIG_FILE))
  if hasattr(vocab, "sentencepiece_model_file"):  # Translation runs.
    import shutil  # pylint: disable=g-import-not-at-top

    dest = os.path.join(directory, SPM_FILE)
    if os.path.abspath(vocab.sentencepiece_model_file) != dest:
      shutil.copyfile(vocab.sentencepiece_model_file, dest + ".tmp")
      os.replace(dest + ".tmp", dest)
    info = {
        "kind": "sentencepiece",
        "file": SPM_FILE,
        "size": int(vocab.vocab_size),
        "sha1": file_sha1(dest),
    }
  elif hasattr(vocab, "tokens"):  # A WordVocabulary.
    vocab.save(os.path.join(directory, "vocab.txt"))
    info = {"kind": "words", "file": "vocab.txt", "size": vocab.vocab_size}
  else:
    info = {"kind": "bytes", "size": int(vocab.vocab_size)}
  write_json(os.path.join(directory, VOCAB_FILE), info)


def read_vocabulary(files: RunFiles, config: ml_collections.ConfigDict) -> Any:
  """The vocabulary a run saved; runs that saved none rebuild it from data."""
  from memjax.data import spm_vocab  # pylint: disable=g-import-not-at-top
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  path = os.path.join(files.path, VOCAB_FILE)
  if not os.path.isfile(path):
    if files.kind == "export":
      raise errors.DataError(f"export {files.path} has no {VOCAB_FILE}")
    from memjax.data import sources  # pylint: disable=g-import-not-at-top

    d = config.data
    return vocab_lib.get_vocabulary(
        d.corpus,
        d.data_dir or sources.default_data_dir(d.corpus),
        d.cache_dir or os.path.join(files.path, "cache"),
    )
  info = files.read_json(VOCAB_FILE)
  if info["kind"] == "bytes":
    return vocab_lib.byte_vocabulary()
  if info["kind"] == "sentencepiece":
    return spm_vocab.load_sentencepiece(os.path.join(files.path, info["file"]))
  return vocab_lib.WordVocabulary.load(os.path.join(files.path, info["file"]))


def write_export(
    out_dir: str,
    config: ml_collections.ConfigDict,
    vocab: Any,
    params: Any,
    meta: dict[str, Any],
) -> None:
  """Writes an export of ``params`` (``experiment.load`` restores it).

  ``export.json`` holds ``meta`` (signature, step, dtype, source, ...) and
  the number of parameters. The export is written under
  ``<out_dir>.partial`` and then moved into place, replacing an earlier
  one, so ``out_dir`` always holds a whole export.
  """
  # Orbax and jax only here: the rest of this module reads run files.
  import shutil  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  from memjax import checkpointing  # pylint: disable=g-import-not-at-top

  tmp, old = out_dir + ".partial", out_dir + ".old"
  for d in (tmp, old):
    if os.path.exists(d):
      shutil.rmtree(d)
  write_run_files(tmp, config, vocab)
  checkpointing.save_export_params(os.path.join(tmp, "params"), params)
  n = int(sum(x.size for x in jax.tree.leaves(params)))
  write_json(os.path.join(tmp, EXPORT_FILE), {**meta, "num_params": n})
  if os.path.exists(out_dir):
    os.replace(out_dir, old)
  os.replace(tmp, out_dir)
  shutil.rmtree(old, ignore_errors=True)
