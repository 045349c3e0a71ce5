"""The tensors of a Hugging Face folder's safetensors checkpoint, in NumPy.

A folder holds ``model.safetensors`` or, for a large model, shards named by
``model.safetensors.index.json`` (its ``weight_map``: tensor -> shard).
They are parsed by the ``safetensors`` package (no torch), through
memjax's path layer (a local folder or a bucket); each file is read whole
into memory. Its NumPy loader knows no bfloat16, the dtype of most Llama
checkpoints, so the raw buffers become arrays here, bfloat16 through
``ml_dtypes`` (which JAX itself depends on).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np

from memjax import errors
from memjax.io import optional
from memjax.io import paths

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


# safetensors dtype names -> NumPy dtypes.
DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _load(path: str) -> dict[str, np.ndarray]:
  """The tensors of one safetensors file."""
  st = optional.require("safetensors", "importing a pretrained model")
  try:
    views = st.deserialize(paths.read_bytes(path))
  except Exception as e:  # The format's errors have no common base.
    raise errors.DataError(
        f"{path} is not a readable safetensors file ({e}): fetch it again"
    ) from None
  out = {}
  for name, view in views:
    if view["dtype"] not in DTYPES:
      raise errors.DataError(
          f"{path}: tensor {name} has dtype {view['dtype']}, which memjax "
          "does not read"
      )
    data = np.frombuffer(bytes(view["data"]), DTYPES[view["dtype"]])
    out[name] = data.reshape(view["shape"])
  return out


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


def read_tensors(folder: str) -> dict[str, np.ndarray]:
  """{PyTorch parameter name: array} of the checkpoint in ``folder``.

  Raises:
    errors.DataError: neither file, a shard the index names is missing, or
      a file that is not safetensors.
  """
  single, index = paths.join(folder, SINGLE), paths.join(folder, INDEX)
  if paths.isfile(single):
    return _load(single)
  check_weights(folder)
  try:
    weight_map = json.loads(paths.read_text(index))["weight_map"]
  except (ValueError, KeyError, TypeError):
    raise errors.DataError(f"{index} has no weight_map: fetch it again")
  out = {}
  for shard in sorted(set(weight_map.values())):
    path = paths.join(folder, shard)
    if not paths.isfile(path):
      raise errors.DataError(
          f"{index} names {shard}, which {folder} lacks: fetch every shard"
      )
    out.update(_load(path))
  return out
