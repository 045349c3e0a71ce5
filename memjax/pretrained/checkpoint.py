"""The tensors of a Hugging Face folder's safetensors checkpoint, read one
at a time.

A folder holds ``model.safetensors`` or, for a large model, shards named by
``model.safetensors.index.json`` (its ``weight_map``: tensor -> shard).
``Tensors`` reads only the files' headers when it opens them (names,
dtypes, shapes); each tensor is read when it is asked for, through the
``safetensors`` package's memory-mapped ``safe_open`` (NumPy; bfloat16 as
``ml_dtypes.bfloat16`` from safetensors 0.8), and converted straight to the
dtype asked for. One shard is mapped at a time, so an import holds at most
one shard's pages besides the tensors it keeps. A shard in a bucket is
fetched to a local temporary file first (``paths.local_file``): mapping
needs a local file.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from memjax import errors
from memjax.io import optional
from memjax.io import paths

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"

# The safetensors dtypes memjax reads (the header's names).
DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL")


def _safe_open(path: str) -> Any:
  """``safetensors.safe_open`` of a shard (DataError if unreadable)."""
  st = optional.require("safetensors", "importing a pretrained model")
  try:
    return st.safe_open(paths.local_file(path), framework="numpy")
  except Exception as e:  # The format's errors have no common base.
    raise errors.DataError(
        f"{path} is not a readable safetensors file ({e}): fetch it again"
    ) from None


class Tensors:
  """A checkpoint's tensors by PyTorch parameter name, read on demand.

  ``name in tensors``, ``tensors.shape(name)``, ``tensors.dtype(name)``
  (the safetensors name, e.g. 'BF16') and ``tensors.read(name, dtype)``;
  ``close()`` unmaps the open shard.
  """

  def __init__(self, shards: Sequence[str]):
    """Reads the headers of ``shards``.

    Args:
      shards: the safetensors files (their tensors do not overlap).

    Raises:
      errors.DataError: a file that is not safetensors, or a dtype memjax
        does not read.
    """
    self._where: dict[str, str] = {}
    self._meta: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in shards:
      with _safe_open(path) as f:
        for name in f.keys():
          view = f.get_slice(name)
          dtype = view.get_dtype()
          if dtype not in DTYPES:
            raise errors.DataError(
                f"{path}: tensor {name} has dtype {dtype}, which memjax "
                "does not read"
            )
          self._where[name] = path
          self._meta[name] = (dtype, tuple(int(n) for n in view.get_shape()))
    # (path, safe_open's context manager, the open file) of the mapped shard.
    self._open: Optional[tuple[str, Any, Any]] = None

  def __contains__(self, name: str) -> bool:
    return name in self._where

  def __iter__(self) -> Iterator[str]:
    return iter(self._where)

  def __len__(self) -> int:
    return len(self._where)

  def shape(self, name: str) -> tuple[int, ...]:
    return self._meta[name][1]

  def dtype(self, name: str) -> str:
    return self._meta[name][0]

  def shard(self, name: str) -> str:
    """The file holding ``name``."""
    return self._where[name]

  def read(self, name: str, dtype: Any = None) -> np.ndarray:
    """The tensor ``name`` (its own dtype, or converted to ``dtype``).

    The shard holding it stays mapped until a tensor of another shard is
    read (or ``close``).
    """
    path = self._where[name]
    if self._open is None or self._open[0] != path:
      self.close()
      handle = _safe_open(path)
      self._open = (path, handle, handle.__enter__())
    array = self._open[2].get_tensor(name)
    if dtype is None or array.dtype == np.dtype(dtype):
      return array
    return array.astype(dtype)

  def close(self) -> None:
    """Unmaps the open shard, if any."""
    if self._open is not None:
      self._open[1].__exit__(None, None, None)
      self._open = None


def check_weights(folder: str) -> None:
  """Raises ``errors.DataError`` (one line) when ``folder`` holds neither
  checkpoint file: no weights to import (``--mode=plan`` plans the model
  from its config.json alone)."""
  if not any(paths.isfile(paths.join(folder, f)) for f in (SINGLE, INDEX)):
    raise errors.DataError(
        f"{folder} has no {SINGLE} or {INDEX}, no weights to import: fetch "
        "the model's safetensors files into it (docs/pretrained.md); "
        "--mode=plan plans the model from its config.json alone"
    )


def shard_paths(folder: str) -> list[str]:
  """The safetensors files of the checkpoint in ``folder``.

  Raises:
    errors.DataError: neither file, an index without a weight map, or a
      shard the index names is missing.
  """
  single, index = paths.join(folder, SINGLE), paths.join(folder, INDEX)
  if paths.isfile(single):
    return [single]
  check_weights(folder)
  try:
    weight_map = json.loads(paths.read_text(index))["weight_map"]
  except (ValueError, KeyError, TypeError):
    raise errors.DataError(f"{index} has no weight_map: fetch it again")
  out = []
  for shard in sorted(set(weight_map.values())):
    path = paths.join(folder, shard)
    if not paths.isfile(path):
      raise errors.DataError(
          f"{index} names {shard}, which {folder} lacks: fetch every shard"
      )
    out.append(path)
  return out


def open_tensors(folder: str) -> Tensors:
  """The tensors of the checkpoint in ``folder``, not yet read.

  Raises:
    errors.DataError: as ``shard_paths`` and ``Tensors`` say.
  """
  return Tensors(shard_paths(folder))


def read_tensors(folder: str) -> dict[str, np.ndarray]:
  """{PyTorch parameter name: array} of the whole checkpoint in ``folder``,
  each in its own dtype (small checkpoints and tests; an import streams
  through ``open_tensors``)."""
  tensors = open_tensors(folder)
  try:
    return {name: tensors.read(name) for name in tensors}
  finally:
    tensors.close()
