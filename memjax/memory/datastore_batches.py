"""Datastores of any model's (g, value) pairs, from a fixed list of batches.

``memory/datastore.py`` builds the LM's datastore from a token stream's
evaluation windows; ``build_from_batches`` is the same on-disk format
(shards, ``build.json``, manifest; resumable) for other models, e.g. a
translation decoder's teacher-forced states over the training targets
(``memjax/methods/external/mt_datastore.py``). It reuses the shard writer and
manifest of ``datastore`` (their file layout is one format).
"""

# pylint: disable=protected-access

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import numpy as np

from memjax import console
from memjax import paths
from memjax.memory import datastore as ds


@dataclasses.dataclass(frozen=True)
class BatchBuildSpec:
  """A datastore built from a fixed list of batches of any model (e.g. a
  decoder's teacher-forced states); ``build.json``, fixed once started.

  ``context`` records what the values mean (their vocabulary, the task)
  and is copied into the manifest."""

  signature: dict[str, Any]
  checkpoint: dict[str, Any]
  dim: int
  corpus: str
  split: str
  context: dict[str, Any]
  num_batches: int
  shard_batches: int

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def build_from_batches(
    features: Callable,
    batches: Callable[[int, int], Iterator[dict[str, np.ndarray]]],
    spec: BatchBuildSpec,
    path: str,
    *,
    process_index: int = 0,
    process_count: int = 1,
) -> ds.Datastore | None:
  """Writes (or resumes) a datastore of the pairs ``features`` returns.

  The general form of ``datastore.build`` for models other than the LM: shard s
  holds the pairs of batches [s * shard_batches, (s + 1) * shard_batches);
  complete shards are kept on resume. ``datastore.check_build_dir(path, spec)`` must
  have passed.

  Args:
    features: ``features(batch) -> (g [..., D], values [...], positions
      [...])``; pairs whose position is -1 are not stored.
    batches: ``batches(first, stop)`` yields batches first..stop-1.
    spec: the build.
    path: the datastore directory.
    process_index: k; this process writes the shards s with s % n == k.
    process_count: n.

  Returns:
    The joined datastore, or None while other processes' shards are
    missing (the build that writes the last one joins them).
  """
  paths.makedirs(path)
  if not paths.exists(paths.join(path, "build.json")):
    ds._write_json(paths.join(path, "build.json"), spec.to_json())
  total = max(1, -(-spec.num_batches // spec.shard_batches))
  progress = console.Progress(0)  # keys; their number is known at the end
  for s in range(process_index, total, process_count):
    base = paths.join(path, ds._shard_name(s))
    if paths.exists(base + ".json"):
      continue
    first = s * spec.shard_batches
    stop = min(first + spec.shard_batches, spec.num_batches)
    count, first_pos = ds._write_shard(
        features, batches(first, stop), base, spec.dim, progress,
        f"shard {s + 1}/{total}",
    )  # fmt: skip
    ds._write_json(
        base + ".json",
        {
            "name": ds._shard_name(s),
            "count": count,
            "first_position": first_pos,
        },
    )
  names = [paths.join(path, ds._shard_name(s) + ".json") for s in range(total)]
  missing = sum(not paths.exists(n) for n in names)
  if missing:
    console.info(
        "datastore: %d of %d shards are other processes' to write; the "
        "last build joins them", missing, total,
    )  # fmt: skip
    return None
  shards = [ds._read_json(n) for n in names]
  if not paths.exists(paths.join(path, "manifest.json")):
    ds._write_manifest(
        path, shards, spec.signature, spec.dim, spec.corpus, spec.split,
        context=spec.context, checkpoint=spec.checkpoint,
    )  # fmt: skip
  return ds.open_datastore(path)
