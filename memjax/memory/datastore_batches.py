"""Datastores of any model's (g, value) pairs, from a fixed list of batches.

``memory/datastore.py`` builds the LM's datastore from a token stream's
evaluation windows; ``build_from_batches`` is the same on-disk format
(shards, ``build.json``, manifest; resumable) for other models, e.g. a
translation decoder's teacher-forced states over the training targets
(``memjax/methods/external/mt_datastore.py``). Both write through
``memory/shards.py`` (their file layout is one format).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import numpy as np

from memjax.memory import datastore as ds
from memjax.memory import shards


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

  The general form of ``datastore.build`` for models other than the LM:
  shard s holds the pairs of batches [s * shard_batches, (s + 1) *
  shard_batches); complete shards are kept on resume (``shards.write``).
  ``datastore.check_build_dir(path, spec)`` must have passed.

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
  total = max(1, -(-spec.num_batches // spec.shard_batches))

  def shard_batches(s: int) -> Iterator[dict[str, np.ndarray]]:
    first = s * spec.shard_batches
    return batches(first, min(first + spec.shard_batches, spec.num_batches))

  shards.write(
      path,
      spec.to_json(),
      total,
      (process_index, process_count),
      features,
      shard_batches,
      spec.dim,
  )
  joined = shards.join(
      path,
      total,
      signature=spec.signature,
      dim=spec.dim,
      corpus=spec.corpus,
      split=spec.split,
      context=spec.context,
      checkpoint=spec.checkpoint,
  )
  return ds.open_datastore(path) if joined else None
