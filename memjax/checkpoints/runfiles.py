"""The files a run or an export keeps beside its arrays.

A workdir holds ``config.json`` (the whole config), ``vocab.json`` (which
vocabulary: ``{"kind": "words", "file": "vocab.txt"}`` or ``{"kind":
"bytes"}`` or ``"sentencepiece"``) with ``vocab.txt`` for word corpora
and ``spm.model`` for translation, and ``checkpoints/``. An
export holds the same two files, ``export.json`` and ``params/`` (and
``model_state/`` for a model that carries state). With these
a run is restored from its directory alone: no config file, flags or corpus
are needed to load it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional


from memjax import errors
from memjax.io import lease
from memjax.io import paths

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
EXPORT_FILE = "export.json"
SPM_FILE = "spm.model"


def file_sha1(path: str) -> str:
  """The SHA-1 of a file's bytes (hex)."""
  import hashlib  # pylint: disable=g-import-not-at-top

  return hashlib.sha1(paths.read_bytes(path)).hexdigest()


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
    return paths.join(self.path, "checkpoints")

  @property
  def params_dir(self) -> str:
    return paths.join(self.path, "params")

  @property
  def model_state_dir(self) -> str:
    """An export's model state (``TrainState.model_state``), if it has one."""
    return paths.join(self.path, "model_state")

  def read_json(self, name: str) -> dict[str, Any]:
    return paths.read_json(paths.join(self.path, name))


def _has_steps(directory: str) -> bool:
  return paths.isdir(directory) and any(
      s.isdigit() for s in paths.listdir(directory)
  )


def has_checkpoints(workdir: str) -> bool:
  """Whether ``workdir`` holds a checkpoint step (a run that resumes)."""
  return _has_steps(paths.join(workdir, "checkpoints"))


def check_init_from(source: str, workdir: str) -> None:
  """Refuses a ``train.init_from`` that names no run or export, before
  anything is read or written (a run that resumes ignores it).

  Raises:
    errors.MissingRunError: one line naming ``train.init_from``.
  """
  if not source or has_checkpoints(workdir):
    return
  try:
    find(source)
  except errors.MissingRunError as e:
    raise errors.MissingRunError(f"train.init_from={source}: {e}") from None


def find(path: str) -> RunFiles:
  """Identifies a workdir, its ``checkpoints`` folder, or an export.

  Raises:
    errors.MissingRunError: nothing restorable there.
  """
  path = paths.resolve(path)
  if paths.basename(path) == "checkpoints" and _has_steps(path):
    path = paths.dirname(path)
  if paths.isfile(paths.join(path, EXPORT_FILE)):
    return RunFiles("export", path)
  if _has_steps(paths.join(path, "checkpoints")):
    return RunFiles("run", path)
  if paths.isfile(paths.join(path, CONFIG_FILE)):
    raise errors.MissingRunError(
        f"{path} holds a run with no finished checkpoint (it was stopped "
        "before its first checkpoint was written): run the same training "
        "command again to resume it, then evaluate"
    )
  raise errors.MissingRunError(
      f"{path} holds no trained run (no checkpoints/<step>) and no export "
      f"({EXPORT_FILE}): train first, or point at a run or export directory"
  )


# Entries only a training run writes into its workdir.
_RUN_ENTRIES = (
    CONFIG_FILE,
    VOCAB_FILE,
    "checkpoints",
    "train_log.jsonl",
    lease.LEASE_FILE,
)
# Files of a token cache (memjax.data.tasks, memjax.data.vocab,
# memjax.data.mlm): <corpus>.<split>.v<size>.<key>.npz,
# <corpus>.vocab.<key>.txt, mlm_<split>_<key>.npy, spm_mlm_<n>_<key>.model.
_CACHE_FILE = re.compile(
    r"(\.v\d+\.[0-9a-f]{12}\.npz|\.vocab\.[0-9a-f]+\.txt|^mlm_\w+_[0-9a-f]+"
    r"\.npy|^spm_mlm_\d+_[0-9a-f]+\.model)$"
)


def not_a_run(path: str) -> Optional[str]:
  """What ``path`` holds when it is something other than a run's workdir:
  'an export', 'a datastore', 'a token cache', 'a checkpoints folder', 'an
  Orbax checkpoint' or 'a file'; None for a run, an empty directory or
  nothing (``path`` need not exist). Reads names only."""
  if not paths.exists(path):
    return None
  if not paths.isdir(path):
    return "a file"
  names = set(paths.listdir(path))
  if EXPORT_FILE in names:
    return "an export"
  if "build.json" in names or (
      "manifest.json" in names and any(n.startswith("shard-") for n in names)
  ):
    return "a datastore"
  if paths.basename(path) == "checkpoints" and _has_steps(path):
    return "a checkpoints folder"
  if names & {"_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt"}:
    return "an Orbax checkpoint"
  if not names & set(_RUN_ENTRIES) and any(
      _CACHE_FILE.search(n) for n in names
  ):
    return "a token cache"
  return None


def check_workdir(
    workdir: str, training: bool, before_training: frozenset[str] = frozenset()
) -> None:
  """Refuses a workdir that holds something other than a run; reads names
  only and writes nothing.

  Every mode refuses datastores, token caches and checkpoint folders.
  Training also refuses an export (other modes read one and write their
  results beside its files) and a directory that holds files but none of
  a run's (``config.json``, ``checkpoints/``, ``train_log.jsonl``) or of
  ``before_training``, what a mode leaves before training
  (``extend.Mode.writes``, e.g. ``--mode=pack``'s summary).

  Raises:
    errors.WorkdirError: naming what ``workdir`` holds.
  """
  kind = not_a_run(workdir)
  if kind == "a file":
    raise errors.WorkdirError(
        f"--workdir {workdir} exists and is not a directory: choose another"
    )
  if kind == "an export" and not training:
    return
  if kind is None and training and paths.isdir(workdir):
    names = set(paths.listdir(workdir))
    allowed = set(_RUN_ENTRIES + ("cache",)) | set(before_training)
    if names and not names & allowed:
      shown = sorted(names)[:3] + (["..."] if len(names) > 3 else [])
      kind = f"files but no run ({', '.join(shown)})"
  if kind is not None:
    raise errors.WorkdirError(
        f"--workdir {workdir} holds {kind}, not a run: nothing was written; "
        "give a new or empty directory (or a run's) as --workdir"
    )


def write_table(workdir: str, table: dict[str, Any]) -> dict[str, Any]:
  """A demo's results: ``table`` as ``<workdir>/table.json`` and its
  ``markdown`` as ``table.md``; returns ``table``."""
  paths.write_json(paths.join(workdir, "table.json"), table)
  paths.write_text(paths.join(workdir, "table.md"), table["markdown"] + "\n")
  return table


def read_config_text(files: RunFiles) -> str:
  """The text of the ``config.json`` a run or export saved.

  Raises:
    errors.MissingRunError: the directory has none.
  """
  path = paths.join(files.path, CONFIG_FILE)
  if not paths.isfile(path):
    raise errors.MissingRunError(
        f"{files.path} has checkpoints but no {CONFIG_FILE}; pass the run's "
        "--config to restore it"
    )
  return paths.read_text(path)


def write_run_files(directory: str, config_json: str, vocab: Any) -> None:
  """Writes ``config.json`` (the text ``config_json``) and the vocabulary
  files into ``directory``."""
  paths.makedirs(directory)
  paths.write_text(paths.join(directory, CONFIG_FILE), config_json)
  if hasattr(vocab, "sentencepiece_model_file"):  # Translation runs.
    dest = paths.join(directory, SPM_FILE)
    if paths.resolve(vocab.sentencepiece_model_file) != paths.resolve(dest):
      paths.write_bytes(dest, paths.read_bytes(vocab.sentencepiece_model_file))
    info = {
        "kind": "sentencepiece",
        "file": SPM_FILE,
        "size": int(vocab.vocab_size),
        "sha1": file_sha1(dest),
    }
  elif hasattr(vocab, "json_text"):  # An imported model's tokenizer.json.
    info = vocab.info()
    vocab.save(paths.join(directory, info["file"]))
  elif hasattr(vocab, "tokens"):  # A WordVocabulary.
    vocab.save(paths.join(directory, "vocab.txt"))
    info = {"kind": "words", "file": "vocab.txt", "size": vocab.vocab_size}
  else:
    info = {"kind": "bytes", "size": int(vocab.vocab_size)}
  paths.write_json(paths.join(directory, VOCAB_FILE), info)


def read_vocabulary(files: RunFiles, data: Any) -> Any:
  """The vocabulary a run saved; runs that saved none rebuild it from the
  data their ``data`` settings (``settings.Data``) name."""
  from memjax.data import spm_vocab  # pylint: disable=g-import-not-at-top
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  path = paths.join(files.path, VOCAB_FILE)
  if not paths.isfile(path):
    if files.kind == "export":
      raise errors.DataError(f"export {files.path} has no {VOCAB_FILE}")
    from memjax.data import sources  # pylint: disable=g-import-not-at-top

    d = data
    return vocab_lib.get_vocabulary(
        d.corpus,
        d.data_dir or sources.default_data_dir(d.corpus),
        d.cache_dir or paths.join(files.path, "cache"),
    )
  info = files.read_json(VOCAB_FILE)
  if info["kind"] == "bytes":
    return vocab_lib.byte_vocabulary()
  if info["kind"] == "sentencepiece":
    return spm_vocab.load_sentencepiece(paths.join(files.path, info["file"]))
  if info["kind"] == "tokenizer":
    from memjax.data import tokenizer_vocab  # pylint: disable=g-import-not-at-top

    path = paths.join(files.path, info["file"])
    return tokenizer_vocab.TokenizerVocabulary.load(path, info)
  return vocab_lib.WordVocabulary.load(paths.join(files.path, info["file"]))


def write_export(
    out_dir: str,
    config_json: str,
    vocab: Any,
    params: Any,
    meta: dict[str, Any],
    *,
    model_state: Any = None,
) -> None:
  """Writes an export of ``params`` (``memjax.dispatch.restore`` restores it), and
  of ``model_state`` in ``model_state/`` when the model carries one.

  ``export.json`` holds ``meta`` (signature, step, dtype, source, ...) and
  the number of parameters. The export is written under
  ``<out_dir>.partial`` and then moved into place, replacing an earlier
  one, so ``out_dir`` always holds a whole export.
  """
  # Orbax and jax only here: the rest of this module reads run files.
  import jax  # pylint: disable=g-import-not-at-top

  from memjax.checkpoints import checkpointing  # pylint: disable=g-import-not-at-top

  tmp, old = out_dir + ".partial", out_dir + ".old"
  for d in (tmp, old):
    if paths.exists(d):
      paths.rmtree(d)
  write_run_files(tmp, config_json, vocab)
  checkpointing.save_export_params(paths.join(tmp, "params"), params)
  if model_state:
    checkpointing.save_export_params(
        paths.join(tmp, "model_state"), model_state
    )
  n = int(sum(x.size for x in jax.tree.leaves(params)))
  paths.write_json(paths.join(tmp, EXPORT_FILE), {**meta, "num_params": n})
  if paths.exists(out_dir):
    paths.rename(out_dir, old)
  paths.rename(tmp, out_dir)
  paths.rmtree(old, ignore_errors=True)
