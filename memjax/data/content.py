"""Content keys of corpus files, and the record of what a cache holds.

Token caches and vocabularies are named by what they are made from: the
SHA-256 of each corpus file's bytes and the settings that shape them, not
the files' paths or modification times. A corpus copied to another
directory or machine (new mtimes) therefore finds the caches made from it.

* A file's SHA-256 is computed once per path, size and modification time
  (``paths.stamp``): it is kept in memory and in a sidecar
  ``<cache>/content/sha256.<h>.json`` (h: a hash of the file's path), so a
  later process reads it instead of reading the corpus again.
* Every cache file written is recorded in ``<cache>/content/made.<h>.json``:
  what it is (``what``: kind, corpus, split, settings), where its corpus was
  (``where``: the data directory) and its key. A run whose corpus files are
  missing finds its caches by these records: the one made from its own data
  directory, else the only key recorded for that ``what``. Files that are
  present always win: their key comes from their bytes.

Each sidecar and record is one small JSON file written whole through the
path layer, so runs sharing a cache (the processes of a multihost job, or
a URL such as ``gs://``) never rewrite each other's files.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Callable, Optional, Sequence

from memjax import errors
from memjax.io import paths

# The folder of sidecars and records inside a cache directory.
SUBDIR = "content"

# Length of the keys in cache file names (hex digits of a SHA-256).
KEY_LENGTH = 16


class AmbiguousCacheError(errors.DataError):
  """The corpus files are missing and the cache holds several caches of
  what they would make, from other data directories."""


# SHA-256 by (absolute path, stamp), for this process.
_MEMO: dict[tuple[str, str], str] = {}
_MEMO_LOCK = threading.Lock()
# (sidecar, stamp) pairs known to be on disk.
_STORED: set[tuple[str, str]] = set()


def _entry(cache_dir: str, kind: str, name: str) -> str:
  digest = hashlib.sha1(name.encode()).hexdigest()[:16]
  return paths.join(cache_dir, SUBDIR, f"{kind}.{digest}.json")


def _read_json(path: str) -> dict:
  """A sidecar or record; {} when it is missing or unreadable (damaged
  sidecars are recomputed, damaged records ignored)."""
  try:
    info = paths.read_json(path)
  except (OSError, ValueError):
    return {}
  return info if isinstance(info, dict) else {}


def file_sha256(path: str, cache_dir: str = "", remember: bool = True) -> str:
  """The SHA-256 (hex) of the bytes of ``path``, computed once per path,
  size and modification time.

  Args:
    path: a local path or URL.
    cache_dir: where the sidecar is read and kept ('' = in memory only).
    remember: write the sidecar when it is missing (False: write nothing).
  """
  path = paths.resolve(path)
  stamp = paths.stamp(path)
  sidecar = _entry(cache_dir, "sha256", path) if cache_dir else ""
  with _MEMO_LOCK:
    digest = _MEMO.get((path, stamp))
    stored = (sidecar, stamp) in _STORED
  if digest is None and sidecar and paths.isfile(sidecar):
    info = _read_json(sidecar)
    if info.get("path") == path and info.get("stamp") == stamp:
      digest, stored = str(info["sha256"]), True
  if digest is None:
    with paths.open(path, "rb") as f:
      digest = hashlib.file_digest(f, "sha256").hexdigest()
  if sidecar and remember and not stored:
    try:
      paths.makedirs(paths.dirname(sidecar))
      paths.write_json(
          sidecar, {"path": path, "stamp": stamp, "sha256": digest}
      )
      stored = True
    except OSError:
      pass  # A read-only cache (reading needs no write): kept in memory.
  with _MEMO_LOCK:
    _MEMO[(path, stamp)] = digest
    if stored:
      _STORED.add((sidecar, stamp))
  return digest


def key(
    what: str,
    files: Callable[[], Sequence[str]],
    cache_dir: str,
    where: str,
    remember: bool = True,
) -> str:
  """The key of a cache: a SHA-256 of ``what`` and of the files' bytes.

  Args:
    what: everything besides the files that shapes the cache (kind,
      corpus, split, settings, cache layout version).
    files: returns the corpus files it is made from, or raises
      ``errors.DataError`` when one is missing.
    cache_dir: the cache directory (sidecars and records).
    where: the data directory the files are read from (see ``recorded``).
    remember: keep the files' SHA-256 in sidecars (False: write nothing).

  Returns:
    KEY_LENGTH hex digits; with a file missing, the key recorded for
    ``what`` (``recorded``).

  Raises:
    errors.DataError: a file is missing and nothing is recorded for
      ``what`` (the error of ``files``), or the records are ambiguous.
  """
  try:
    names = files()
  except errors.DataError:
    found = recorded(cache_dir, what, where)
    if found is None:
      raise
    return found
  h = hashlib.sha256(what.encode())
  for name in names:
    h.update(file_sha256(name, cache_dir, remember).encode())
  return h.hexdigest()[:KEY_LENGTH]


def record(cache_dir: str, what: str, where: str, made: str) -> None:
  """Records that ``cache_dir`` holds the cache ``made`` (its key) of
  ``what`` read from ``where``; written only when it changes."""
  path = _entry(cache_dir, "made", f"{what}\n{where}")
  info = {"what": what, "where": where, "key": made}
  if paths.isfile(path) and _read_json(path) == info:
    return
  paths.makedirs(paths.dirname(path))
  paths.write_json(path, info)


def recorded(cache_dir: str, what: str, where: str) -> Optional[str]:
  """The key recorded for ``what`` in ``cache_dir``, or None.

  The record made from ``where`` comes first; else the key when all the
  records of ``what`` agree on one.

  Raises:
    AmbiguousCacheError: records of ``what`` from several data directories
      with different keys, none from ``where``.
  """
  directory = paths.join(cache_dir, SUBDIR)
  if not cache_dir or not paths.isdir(directory):
    return None
  mine = []
  for name in sorted(paths.listdir(directory)):
    if name.startswith("made.") and name.endswith(".json"):
      info = _read_json(paths.join(directory, name))
      if info.get("what") == what and info.get("key"):
        mine.append(info)
  for info in mine:
    if info.get("where") == where:
      return str(info["key"])
  keys = sorted({str(info["key"]) for info in mine})
  if len(keys) > 1:
    origins = ", ".join(sorted(str(info.get("where")) for info in mine))
    raise AmbiguousCacheError(
        f"the cache {cache_dir} holds {len(keys)} different caches of "
        f"{what!r} (made from {origins}) and the corpus files are missing: "
        "give the data directory with the files, or a cache made from one "
        "corpus"
    )
  return keys[0] if keys else None
