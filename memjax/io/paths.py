"""One path layer for every file memjax reads or writes, local or in the cloud.

A path is either local (no scheme, or ``file://``) or a URL ``scheme://...``
(``gs://bucket/run``, ``s3://bucket/run``, ``memory://run``). Local paths go
straight to the operating system (``os``, ``open``; atomic writes by
``os.replace``); URLs go through the ``fsspec`` filesystem of their scheme,
which the scheme's package provides (``gcsfs`` for ``gs://``, ``s3fs`` for
``s3://``; ``memory://`` is built in). Checkpoints are the exception:
Orbax opens ``gs://`` itself, so their URLs are handed to it unchanged.

Why fsspec and not ``etils.epath`` (which Orbax uses): epath knows only
gs/s3/az/hf, not fsspec's in-memory filesystem, on which the tests check
every file memjax writes without a bucket; fsspec knows all of them, and
gcsfs and s3fs are fsspec filesystems.

A URL is never made absolute (``os.path.abspath("gs://b/r")`` would be a
local folder named ``gs:``): ``resolve`` leaves it as it is.

``memjax.io.workdirs.check_workdir`` turns a scheme that cannot be opened
(unknown, its package not installed, no credentials) into one
``errors.StorageError`` line before anything is written anywhere.

Libraries that need a real local file (sentencepiece's model, ScaNN's
serialized index, ``np.memmap``) use ``local_file`` / ``local_dir``: a URL is
downloaded to a temporary folder, or built there and uploaded.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import posixpath
import shutil
import tempfile
import threading
from typing import Any, IO, Iterator, Optional

import numpy as np

from memjax import errors

# What provides each common scheme, for the one-line errors.
_PACKAGES = {
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "s3": "s3fs",
    "s3a": "s3fs",
    "az": "adlfs",
    "abfs": "adlfs",
    "hf": "huggingface_hub",
}


def _scheme(path: str) -> Optional[str]:
  """The URL scheme of ``path`` (None for a local path or ``file://``)."""
  head, sep, _ = str(path).partition("://")
  if not sep or not head or "/" in head or head == "file":
    return None
  return head


def is_url(path: str) -> bool:
  """Whether ``path`` is a URL of a non-local filesystem."""
  return _scheme(os.fspath(path)) is not None


def _local(path: str) -> str:
  path = os.fspath(path)
  return path[len("file://") :] if path.startswith("file://") else path


def filesystem(path: str) -> Any:
  """The ``fsspec`` filesystem of a URL.

  Raises:
    errors.StorageError: an unknown scheme or one whose package is missing.
  """
  return _filesystem_class(path)()


def _filesystem_class(path: str) -> Any:
  """The ``fsspec`` filesystem class of a URL's scheme (nothing connects).

  Raises:
    errors.StorageError: an unknown scheme or one whose package is missing.
  """
  import fsspec  # pylint: disable=g-import-not-at-top

  scheme = _scheme(path)
  try:
    return fsspec.get_filesystem_class(scheme)
  except ImportError:
    package = _PACKAGES.get(scheme, f"the fsspec backend for {scheme}://")
    raise errors.StorageError(
        f"{path}: {scheme}:// needs the package {package}: pip install "
        f"{package}"
    ) from None
  except ValueError:
    raise errors.StorageError(
        f"{path}: unknown storage scheme {scheme}://; use a local path, "
        "gs:// or s3:// (with gcsfs or s3fs installed)"
    ) from None


def resolve(path: str) -> str:
  """An absolute local path (``~`` expanded), or the URL unchanged."""
  path = os.fspath(path)
  if is_url(path):
    return path.rstrip("/") if not path.endswith("://") else path
  return os.path.abspath(os.path.expanduser(_local(path)))


def realpath(path: str) -> str:
  """``resolve`` with local symbolic links followed (a URL unchanged)."""
  return path if is_url(path) else os.path.realpath(resolve(path))


def join(base: str, *parts: str) -> str:
  """``base/part/...``; URLs join with ``/``."""
  base = os.fspath(base)
  if is_url(base):
    return posixpath.join(base, *parts)
  return os.path.join(_local(base), *parts)


def dirname(path: str) -> str:
  """The folder of ``path`` (a URL keeps its scheme and bucket)."""
  path = os.fspath(path)
  if is_url(path):
    scheme, _, rest = path.partition("://")
    parent = posixpath.dirname(rest.rstrip("/"))
    return f"{scheme}://{parent}"
  return os.path.dirname(_local(path))


def basename(path: str) -> str:
  """The last part of ``path``."""
  path = os.fspath(path)
  if is_url(path):
    return posixpath.basename(path.rstrip("/"))
  return os.path.basename(_local(path))


def exists(path: str) -> bool:
  if is_url(path):
    return filesystem(path).exists(path)
  return os.path.exists(_local(path))


def isdir(path: str) -> bool:
  if is_url(path):
    return filesystem(path).isdir(path)
  return os.path.isdir(_local(path))


def isfile(path: str) -> bool:
  if is_url(path):
    return filesystem(path).isfile(path)
  return os.path.isfile(_local(path))


def getsize(path: str) -> int:
  """The size of a file in bytes."""
  if is_url(path):
    return int(filesystem(path).size(path))
  return os.path.getsize(_local(path))


def stamp(path: str) -> str:
  """'size|modification time' of a file, to key caches of what it holds.

  Local files give ``st_size|st_mtime_ns``; a URL's file its size and the
  modification time its filesystem reports (or its checksum where it
  reports no time).
  """
  if not is_url(path):
    st = os.stat(_local(path))
    return f"{st.st_size}|{st.st_mtime_ns}"
  info = filesystem(path).info(path)
  when = next(
      (
          info[k]
          for k in (
              "mtime",
              "updated",
              "LastModified",
              "md5Hash",
              "ETag",
              "created",
          )
          if info.get(k) is not None
      ),
      "",
  )
  return f"{info.get('size', '')}|{when}"


def np_savez(path: str, **arrays: np.ndarray) -> None:
  """Saves arrays as an uncompressed ``.npz``, whole (see ``write_bytes``)."""
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  write_bytes(path, buf.getvalue())


def du(path: str) -> int:
  """Bytes in the files under the directory ``path``."""
  if is_url(path):
    return int(filesystem(path).du(path, total=True))
  return sum(
      os.path.getsize(os.path.join(d, f))
      for d, _, files in os.walk(_local(path))
      for f in files
  )


def makedirs(path: str) -> None:
  """Creates ``path`` and its parents (no error if it exists)."""
  if is_url(path):
    filesystem(path).makedirs(path, exist_ok=True)
  else:
    os.makedirs(_local(path), exist_ok=True)


def listdir(path: str) -> list[str]:
  """The names (not paths) of the entries of a directory."""
  if is_url(path):
    fs = filesystem(path)
    own = fs._strip_protocol(path).rstrip("/")  # pylint: disable=protected-access
    return sorted(
        posixpath.basename(p.rstrip("/"))
        for p in fs.ls(path, detail=False)
        if p.rstrip("/") != own
    )
  return sorted(os.listdir(_local(path)))


def glob(pattern: str) -> list[str]:
  """The paths (URLs for a URL pattern) that match ``pattern``, sorted."""
  if is_url(pattern):
    scheme = _scheme(pattern)
    found = filesystem(pattern).glob(pattern)
    return sorted(f"{scheme}://{p.lstrip('/')}" for p in found)
  import glob as glob_lib  # pylint: disable=g-import-not-at-top

  return sorted(glob_lib.glob(_local(pattern)))


def open(path: str, mode: str = "r", **kwargs: Any) -> IO[Any]:  # pylint: disable=redefined-builtin
  """Opens a file for reading or writing, text or binary (``mode``).

  A URL's file is written when it is closed (an object store's upload is
  all or nothing).
  """
  if is_url(path):
    if "b" not in mode:
      kwargs.setdefault("encoding", "utf-8")
    return filesystem(path).open(path, mode, **kwargs)
  return io.open(_local(path), mode, **kwargs)  # pylint: disable=unspecified-encoding


def read_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str) -> str:
  with open(path, "r", encoding="utf-8") as f:
    return f.read()


def write_bytes(path: str, data: bytes) -> None:
  """Writes ``data`` whole: a local file through a temporary file and a
  rename, so readers never see half of it."""
  if is_url(path):
    with open(path, "wb") as f:
      f.write(data)
    return
  path = _local(path)
  fd, tmp = tempfile.mkstemp(
      dir=os.path.dirname(path) or ".", prefix=".tmp-", suffix=".part"
  )
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str, text: str) -> None:
  """Writes ``text`` (UTF-8) whole; see ``write_bytes``."""
  write_bytes(path, text.encode("utf-8"))


def append_text(path: str, text: str) -> None:
  """Appends ``text`` to a file (created if absent). Object stores cannot
  append: a URL's file is read and written again whole, which suits the
  small logs this is for."""
  if not is_url(path):
    with io.open(_local(path), "a", encoding="utf-8") as f:
      f.write(text)
    return
  old = read_text(path) if exists(path) else ""
  write_text(path, old + text)


def read_json(path: str) -> Any:
  return json.loads(read_text(path))


def write_json(path: str, obj: Any, **kwargs: Any) -> None:
  """Writes ``obj`` as JSON whole (``indent=2, sort_keys=True`` unless
  given); see ``write_bytes``."""
  kwargs.setdefault("indent", 2)
  kwargs.setdefault("sort_keys", True)
  write_text(path, json.dumps(obj, **kwargs))


def np_save(path: str, array: np.ndarray) -> None:
  """Saves one array in NumPy's ``.npy`` format, whole."""
  buf = io.BytesIO()
  np.save(buf, np.asarray(array))
  write_bytes(path, buf.getvalue())


def np_load(path: str) -> Any:
  """Loads a ``.npy`` array or ``.npz`` archive (no pickles); a URL's file
  is read into memory first."""
  if is_url(path):
    return np.load(io.BytesIO(read_bytes(path)), allow_pickle=False)
  return np.load(_local(path), allow_pickle=False)


def remove(path: str) -> None:
  """Deletes a file."""
  if is_url(path):
    filesystem(path).rm(path)
  else:
    os.remove(_local(path))


def rmtree(path: str, ignore_errors: bool = False) -> None:
  """Deletes a directory and everything in it."""
  try:
    if is_url(path):
      filesystem(path).rm(path, recursive=True)
    else:
      shutil.rmtree(_local(path))
  except (OSError, errors.StorageError):
    if not ignore_errors:
      raise


def rename(src: str, dest: str) -> None:
  """Moves a file or directory; ``dest`` is replaced if it is a file.

  Atomic for local paths (``os.replace``); object stores copy, then delete.
  """
  if is_url(src) or is_url(dest):
    filesystem(src if is_url(src) else dest).mv(src, dest, recursive=True)
  else:
    os.replace(_local(src), _local(dest))


def copy(src: str, dest: str) -> None:
  """Copies one file, between any two filesystems."""
  if not is_url(src) and not is_url(dest):
    shutil.copyfile(_local(src), _local(dest))
    return
  with open(src, "rb") as fin, open(dest, "wb") as fout:
    shutil.copyfileobj(fin, fout)


# -- Real local files, for libraries that need them ----------------------------

_DOWNLOADS: dict[str, str] = {}
_DOWNLOAD_LOCK = threading.Lock()


def _download_root() -> str:
  root = _DOWNLOADS.get("")
  if root is None:
    root = tempfile.mkdtemp(prefix="memjax-downloads-")
    atexit.register(shutil.rmtree, root, True)
    _DOWNLOADS[""] = root
  return root


def local_file(path: str) -> str:
  """A local path holding the file ``path``: itself when it is local, else a
  copy downloaded once per process (removed when the process exits)."""
  if not is_url(path):
    return _local(path)
  with _DOWNLOAD_LOCK:
    if path not in _DOWNLOADS:
      target = os.path.join(
          tempfile.mkdtemp(dir=_download_root()), basename(path)
      )
      filesystem(path).get(path, target)
      _DOWNLOADS[path] = target
    return _DOWNLOADS[path]


@contextlib.contextmanager
def local_dir(path: str, mode: str = "r") -> Iterator[str]:
  """A local directory standing for the directory ``path``.

  Local paths are yielded as they are. For a URL, ``mode='r'`` downloads
  the directory into a temporary one; ``mode='w'`` yields an empty
  temporary directory whose contents are uploaded to ``path`` when the
  block ends without an exception. The temporary directory is removed.
  """
  if not is_url(path):
    if mode == "w":
      os.makedirs(_local(path), exist_ok=True)
    yield _local(path)
    return
  tmp = tempfile.mkdtemp(prefix="memjax-dir-")
  try:
    fs = filesystem(path)
    if mode == "r":
      for name in listdir(path):
        src = join(path, name)
        fs.get(src, os.path.join(tmp, name), recursive=fs.isdir(src))
    yield tmp
    if mode == "w":
      fs.makedirs(path, exist_ok=True)
      for name in os.listdir(tmp):
        src = os.path.join(tmp, name)
        fs.put(src, join(path, name), recursive=os.path.isdir(src))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def savefig(fig: Any, path: str, **kwargs: Any) -> None:
  """Saves a matplotlib figure (format from the file's extension)."""
  kwargs.setdefault("format", os.path.splitext(path)[1].lstrip(".") or "png")
  buf = io.BytesIO()
  fig.savefig(buf, **kwargs)
  write_bytes(path, buf.getvalue())
