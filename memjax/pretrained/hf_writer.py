"""A Hugging Face checkpoint written from NumPy: safetensors files, sharded.

What ``save_pretrained`` writes and ``from_pretrained`` (and
``checkpoint.read_tensors``) reads: ``model.safetensors`` when the tensors
fit one shard, else ``model-00001-of-0000n.safetensors`` ... with
``model.safetensors.index.json`` (``metadata.total_size``: the tensors'
bytes; ``weight_map``: tensor -> file). Shards are filled in the tensors'
order, a new one begun when the next tensor would pass the size limit (a
tensor larger than the limit is a shard of its own), as Hugging Face's
``split_torch_state_dict_into_shards`` does. Each file's header holds
``{"format": "pt"}``. Files are written one at a time through memjax's
path layer, by the ``safetensors`` package's NumPy API (bfloat16 arrays of
``ml_dtypes``, as ``checkpoint`` reads them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memjax.io import optional
from memjax.io import paths
from memjax.pretrained import checkpoint

# The header's metadata, as PyTorch's save_pretrained writes it.
METADATA = {"format": "pt"}


def shard_name(i: int, n: int) -> str:
  """The file of shard ``i`` (from 0) of ``n``."""
  return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def plan_shards(sizes: list[tuple[str, int]], limit: int) -> list[list[str]]:
  """The tensors' names grouped into shards.

  Args:
    sizes: (name, bytes) of each tensor, in the order they are written.
    limit: a shard's most bytes (a larger tensor is a shard of its own).

  Returns:
    The names of each shard, in order; one shard when all fit.
  """
  shards: list[list[str]] = [[]]
  used = 0
  for name, size in sizes:
    if shards[-1] and used + size > limit:
      shards.append([])
      used = 0
    shards[-1].append(name)
    used += size
  return shards


def write_checkpoint(
    folder: str, tensors: dict[str, np.ndarray], limit: int
) -> list[str]:
  """Writes ``tensors`` into ``folder`` as safetensors, sharded by
  ``limit`` bytes (``plan_shards``), with the index when there are shards.

  Args:
    folder: an existing folder.
    tensors: {name: array}, in the order they are written.
    limit: a shard's most bytes.

  Returns:
    The names of the files written.
  """
  st_numpy = optional.require(
      "safetensors.numpy", "exporting a Hugging Face checkpoint"
  )
  groups = plan_shards([(k, int(v.nbytes)) for k, v in tensors.items()], limit)
  names = (
      [checkpoint.SINGLE]
      if len(groups) == 1
      else [shard_name(i, len(groups)) for i in range(len(groups))]
  )
  weight_map = {}
  for file, group in zip(names, groups):
    part = {k: np.ascontiguousarray(tensors[k]) for k in group}
    data = st_numpy.save(part, metadata=METADATA)
    paths.write_bytes(paths.join(folder, file), data)
    weight_map.update({k: file for k in group})
  if len(groups) == 1:
    return names
  index: dict[str, Any] = {
      "metadata": {"total_size": int(sum(v.nbytes for v in tensors.values()))},
      "weight_map": dict(sorted(weight_map.items())),
  }
  paths.write_json(paths.join(folder, checkpoint.INDEX), index, indent=2)
  return names + [checkpoint.INDEX]
