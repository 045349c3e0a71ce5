"""Paths and URLs (a minimal layer; see the full one in the paths module)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import fsspec


def is_url(path: str) -> bool:
  return "://" in str(path) and not str(path).startswith("file://")


def join(*parts: str) -> str:
  if is_url(parts[0]):
    return "/".join([parts[0].rstrip("/")] + [p.strip("/") for p in parts[1:]])
  return os.path.join(*parts)


def makedirs(path: str) -> None:
  if is_url(path):
    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def open(path: str, mode: str = "r", **kwargs: Any) -> Any:  # pylint: disable=redefined-builtin
  if is_url(path):
    return fsspec.open(path, mode, **kwargs).open()
  import builtins  # pylint: disable=g-import-not-at-top

  return builtins.open(path, mode, **kwargs)


def listdir(path: str) -> list[str]:
  if is_url(path):
    fs, p = fsspec.core.url_to_fs(path)
    return [os.path.basename(x.rstrip("/")) for x in fs.ls(p, detail=False)]
  return os.listdir(path)


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
  if not is_url(path):
    yield path
    return
  import tempfile  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as d:
    local = os.path.join(d, os.path.basename(path))
    fs, p = fsspec.core.url_to_fs(path)
    fs.get(p, local)
    yield local
