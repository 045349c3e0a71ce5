"""Writing a sharded datastore: the build steps every datastore builder shares.

A build directory holds ``build.json`` (the build's parameters, written
once), per shard s the raw arrays ``shard-0000s.keys`` [count, dim] float16
and ``.values`` [count] int32, then ``shard-0000s.json`` (written last: the
shard is complete), and finally ``manifest.json``, which joins the shards.
The format is read by ``memory/datastore.py`` (``open_datastore``).

Process k of n writes the shards s with s % n == k that have no ``.json``
yet (so a build resumes where it stopped); whichever process finds every
shard's ``.json`` writes the manifest. The builders differ only in where
their batches come from: ``datastore.build`` (the LM's evaluation windows)
and ``datastore_batches.build_from_batches`` (any model's fixed batches).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Iterable, Optional

import jax
import numpy as np

from memjax.io import console
from memjax import errors
from memjax.io import paths

KEY_DTYPE = "float16"
VALUE_DTYPE = "int32"
FORMAT_VERSION = 1


def shard_name(s: int) -> str:
  """'shard-00007' for s = 7: the stem of the shard's files."""
  return f"shard-{s:05d}"


def process_share(
    index: Optional[int], count: Optional[int], prefix: str
) -> tuple[int, int]:
  """(k, n): this process writes the shards s with s % n == k.

  Args:
    index: k; None or negative: jax.process_index().
    count: n; None or not positive: jax.process_count().
    prefix: the config keys' prefix, for the error ('datastore' names
      ``datastore.process_index`` / ``datastore.process_count``).

  Raises:
    errors.ConfigError: k outside [0, n).
  """
  k = jax.process_index() if index is None or int(index) < 0 else int(index)
  n = jax.process_count() if count is None or int(count) <= 0 else int(count)
  if not 0 <= k < n:
    raise errors.ConfigError(
        f"{prefix}.process_index={k} must be in [0, {prefix}.process_count={n})"
    )
  return k, n


def to_write(path: str, total: int, index: int, count: int) -> list[int]:
  """The shards s < ``total`` with s % count == index whose ``.json`` is not
  written yet (a resumed build skips the others), ascending."""
  mine = [
      s
      for s in range(index, total, count)
      if not paths.exists(paths.join(path, shard_name(s) + ".json"))
  ]
  console.info(
      "datastore: %d of %d shards to write (process %d of %d) into %s",
      len(mine),
      total,
      index,
      count,
      path,
  )
  return mine


def write_arrays(
    features: Callable,
    batches: Iterable[dict[str, np.ndarray]],
    base: str,
    dim: int,
    progress: console.Progress,
    label: str,
) -> tuple[int, int]:
  """Writes the pairs of ``batches`` to ``base``.keys / .values.

  Files are written locally through .tmp names, renamed when complete (a
  URL's files are uploaded whole when closed).

  Args:
    features: ``features(batch) -> (g [..., dim], values [...], positions
      [...])``; pairs whose position is -1 are not stored.
    batches: the shard's batches.
    base: the shard's path without suffix.
    dim: the key dimension.
    progress: counts the keys written.
    label: where the build is, for the progress line.

  Returns:
    (count of pairs, first stored position or -1).
  """
  count, first_pos = 0, -1
  final = (base + ".keys", base + ".values")
  tmp = final if paths.is_url(base) else (final[0] + ".tmp", final[1] + ".tmp")
  with paths.open(tmp[0], "wb") as fk, paths.open(tmp[1], "wb") as fv:
    for batch in batches:
      g, tgt, pos = jax.device_get(features(batch))
      ok = pos.reshape(-1) >= 0
      fk.write(
          np.ascontiguousarray(
              g.reshape(-1, dim)[ok].astype(np.float16)
          ).tobytes()
      )
      fv.write(tgt.reshape(-1)[ok].astype(np.int32).tobytes())
      if first_pos < 0 and ok.any():
        first_pos = int(pos.reshape(-1)[ok][0])
      count += int(ok.sum())
      progress.add(int(ok.sum()), label)
  for t, f in zip(tmp, final):
    if t != f:
      paths.rename(t, f)
  return count, first_pos


def write(
    path: str,
    build: dict[str, Any],
    total: int,
    share: tuple[int, int],
    features: Callable,
    batches: Callable[[int], Iterable[dict[str, np.ndarray]]],
    dim: int,
    *,
    expected_keys: Callable[[int], int] = lambda n: 0,
    stop_after_shards: int = 0,
) -> bool:
  """Writes ``build.json`` (once) and this process's unwritten shards.

  Args:
    path: the datastore directory (created if missing).
    build: the build's parameters, ``build.json`` (kept when it exists:
      check it before, e.g. ``datastore.check_build_dir``).
    total: the number of shards of the whole build.
    share: (k, n) from :func:`process_share`.
    features: as in :func:`write_arrays`.
    batches: ``batches(s)``, the batches of shard s; asked for this
      process's shards in ascending order.
    dim: the key dimension.
    expected_keys: the keys that a number of shards hold about (the
      progress line's ETA); 0: unknown.
    stop_after_shards: stop after writing this many shards (0: all); for
      tests of an interrupted build.

  Returns:
    Whether all of this process's shards are written (False when stopped).
  """
  paths.makedirs(path)
  if not paths.exists(paths.join(path, "build.json")):
    paths.write_json(paths.join(path, "build.json"), build)
  mine = to_write(path, total, *share)
  progress = console.Progress(expected_keys(len(mine)))
  for written, s in enumerate(mine):
    base = paths.join(path, shard_name(s))
    label = f"shard {s} ({written + 1}/{len(mine)})"
    count, first_pos = write_arrays(
        features, batches(s), base, dim, progress, label
    )
    paths.write_json(
        base + ".json",
        {"name": shard_name(s), "count": count, "first_position": first_pos},
    )
    if stop_after_shards and written + 1 >= stop_after_shards:
      console.info("datastore: stopped after %d shards", written + 1)
      return False
  elapsed = time.time() - progress.start
  console.info(
      "datastore: wrote %d shards, %d keys in %.1fs (%.0f keys/s)",
      len(mine),
      progress.done,
      elapsed,
      progress.done / max(elapsed, 1e-9),
  )
  return True


def join(path: str, total: int, **manifest: Any) -> bool:
  """Writes manifest.json once every shard is complete.

  Args:
    path: the datastore directory.
    total: the number of shards.
    **manifest: :func:`write_manifest`'s signature, dim, corpus, split,
      context and checkpoint.

  Returns:
    Whether the datastore is joined (False while shards are missing).
  """
  entries, missing = [], []
  for s in range(total):
    j = paths.join(path, shard_name(s) + ".json")
    if paths.exists(j):
      entries.append(paths.read_json(j))
    else:
      missing.append(s)
  if missing:
    console.info(
        "datastore: %d of %d shards still missing (%s); the last process to "
        "finish joins them",
        len(missing),
        total,
        ", ".join(map(str, missing[:8])),
    )
    return False
  if not paths.exists(paths.join(path, "manifest.json")):
    write_manifest(path, entries, **manifest)
  return True


def write_manifest(
    path: str,
    shards: list[dict[str, Any]],
    signature: dict[str, Any],
    dim: int,
    corpus: str,
    split: str,
    context: dict[str, Any],
    checkpoint: Optional[dict[str, Any]] = None,
) -> None:
  """manifest.json, which joins ``shards`` (their ``.json`` entries) into a
  datastore."""
  paths.write_json(
      paths.join(path, "manifest.json"),
      {
          "format_version": FORMAT_VERSION,
          "id": uuid.uuid4().hex,
          "signature": signature,
          "checkpoint": checkpoint,
          "dim": dim,
          "key_dtype": KEY_DTYPE,
          "value_dtype": VALUE_DTYPE,
          "count": int(sum(s["count"] for s in shards)),
          "corpus": corpus,
          "split": split,
          "context": context,
          "shards": shards,
      },
  )
