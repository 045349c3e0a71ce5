"""BM25 packing as a SeqIO task whose cache an Apache Beam pipeline writes.

The packed order of a training stream (Algorithm 1, ``bm25``) is a SeqIO
task, ``memjax_bm25_<corpus>_<key>``, where key names the tokens and the
settings that change the order (``bm25_order.order_key``). Its examples are
the segments:

    {'targets': int32 [<= L], 'segment_id': int64, 'packed_position': int64}

* Uncached (``use_cached=False``) the task packs in process
  (``bm25_order.cached_bm25_order``) and yields the segments in order.
* Cached, ``<cache_dir>/bm25/seqio/<task name>/`` holds SeqIO's cache format
  written by the Beam pipeline of ``beam_pipeline`` (``--mode=pack
  --config.pack.runner=DirectRunner|DataflowRunner|...``): the search is
  split over Beam's workers, the sequential packing runs on the joined
  neighbour lists, and the result is the in-process order exactly. Beam
  keeps no order, so :func:`read_order` sorts by ``packed_position``.

A t5x/seqio user reads it with

    task = pack_beam.register_task(name, tokens, ...)  # once per process
    ds = task.get_dataset(split='train', use_cached=True, shuffle=False)

(``register_task`` puts ``<cache_dir>/bm25/seqio`` first among SeqIO's
global cache directories.) ``--mode=pack`` prints the name and writes it to
``bm25_pack.json``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from memjax import errors
from memjax.io import optional
from memjax.io import paths
from memjax.methods.trime import bm25_order

SPLIT = "train"


class CacheError(errors.UserError):
  """A packed cache that is partial or unreadable."""


@dataclasses.dataclass(frozen=True)
class PackSettings:
  """What the packed order depends on (batch_size does not change it)."""

  seq_len: int
  k: int
  seed: int
  stopword_ids: tuple[int, ...] | None = None


def order_key(tokens: np.ndarray, s: PackSettings) -> str:
  """``bm25_order.order_key`` of ``tokens`` packed with ``s``."""
  return bm25_order.order_key(tokens, s.seq_len, s.k, s.seed, s.stopword_ids)


def task_name(
    corpus: str, tokens: np.ndarray, s: PackSettings, key: str | None = None
) -> str:
  """memjax_bm25_<corpus>_<first 12 hex digits of the order's key>
  (``key``: :func:`order_key`, where the caller has it already)."""
  return f"memjax_bm25_{corpus}_{(key or order_key(tokens, s))[:12]}"


def seqio_cache_root(cache_dir: str) -> str:
  """The global SeqIO cache directory of the packed tasks."""
  return paths.join(cache_dir, "bm25", "seqio")


def task_dir(cache_dir: str, name: str) -> str:
  return paths.join(seqio_cache_root(cache_dir), name)


def _in_process_dataset(
    split: str,
    shuffle_files: bool,
    seed: int | None = None,
    *,
    tokens: np.ndarray,
    settings: PackSettings,
    cache_dir: str,
) -> Any:
  """The task's uncached source: the segments in the in-process order."""
  del split, shuffle_files, seed
  tf = optional.tensorflow("the BM25-packed SeqIO task")
  s = settings
  order = bm25_order.cached_bm25_order(
      tokens,
      s.seq_len,
      1,
      s.k,
      s.seed,
      paths.join(cache_dir, "bm25"),
      stopword_ids=s.stopword_ids,
      show_progress=False,
  )

  return tf.data.Dataset.from_generator(
      lambda: bm25_order.segment_examples(order, tokens, s.seq_len),
      output_signature={
          "targets": tf.TensorSpec([None], tf.int32),
          "segment_id": tf.TensorSpec([], tf.int64),
          "packed_position": tf.TensorSpec([], tf.int64),
      },
  )


def register_task(
    name: str,
    tokens: np.ndarray,
    settings: PackSettings,
    cache_dir: str,
    vocabulary: Any = None,
) -> Any:
  """Registers and returns the packed task, read from this cache_dir.

  Args:
    name: from :func:`task_name`.
    tokens: [N] int training stream.
    settings: the packing's settings.
    cache_dir: the run's cache directory.
    vocabulary: the 'targets' seqio vocabulary (None: pass-through ids).
  """
  seqio = optional.require("seqio", "the BM25-packed SeqIO task")
  # This cache root first: seqio reads a task from the first global cache
  # directory holding it, and remembers it; the name is the same in every
  # cache directory, so the task is registered anew for this one.
  root = seqio_cache_root(cache_dir)
  others = [d for d in seqio.get_global_cache_dirs() if d != root]
  seqio.set_global_cache_dirs([root] + others)
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  tokens = np.asarray(tokens, np.int32).reshape(-1)
  if vocabulary is None:
    vocabulary = seqio.PassThroughVocabulary(int(tokens.max(initial=0)) + 1)
  ids = lambda: seqio.Feature(  # pylint: disable=g-long-lambda
      seqio.PassThroughVocabulary(1), add_eos=False, dtype="int64", rank=0
  )
  return seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(
          # A closure, not functools.partial: seqio compares the defaults
          # of dataset_fn's parameters, which an array cannot be.
          dataset_fn=lambda split, shuffle_files, seed=None: (
              _in_process_dataset(
                  split,
                  shuffle_files,
                  seed,
                  tokens=tokens,
                  settings=settings,
                  cache_dir=cache_dir,
              )
          ),
          splits=(SPLIT,),
      ),
      preprocessors=[seqio.CacheDatasetPlaceholder()],
      output_features={
          "targets": seqio.Feature(vocabulary, add_eos=False),
          "segment_id": ids(),
          "packed_position": ids(),
      },
  )


def read_order(task: Any, num_segments: int, directory: str) -> np.ndarray:
  """The packed order from the task's cache, sorted by packed position.

  Args:
    task: the registered packed task.
    num_segments: S.
    directory: its cache directory (named in errors).

  Returns:
    [S] int64: order[p] is the segment at packed position p.

  Raises:
    CacheError: no COMPLETED file, unreadable files, or not a permutation.
  """
  if not paths.exists(paths.join(directory, "COMPLETED")):
    raise CacheError(f"BM25 cache {directory} is partial (no COMPLETED file)")
  tf = optional.tensorflow("reading the BM25-packed SeqIO task")
  if paths.resolve(task.cache_dir or "") != paths.resolve(directory):
    raise CacheError(f"BM25 cache {directory} is not the task's cache")
  try:
    ds = task.get_dataset(
        split=SPLIT, use_cached=True, shuffle=False, try_in_mem_cache=False
    )
    pairs = [
        (int(ex["packed_position"]), int(ex["segment_id"]))
        for ex in ds.as_numpy_iterator()
    ]
  except (tf.errors.OpError, OSError, ValueError, KeyError) as e:
    first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
    raise CacheError(
        f"BM25 cache {directory} is unreadable ({type(e).__name__}: {first})"
    ) from None
  positions = np.array([p for p, _ in pairs], np.int64)
  segments = np.array([s for _, s in pairs], np.int64)
  order = np.full(num_segments, -1, np.int64)
  valid = all(
      bm25_order.is_permutation(a, num_segments) for a in (positions, segments)
  )
  if not valid:
    raise CacheError(
        f"BM25 cache {directory} holds {len(pairs)} examples, not a "
        f"permutation of the {num_segments} segments"
    )
  order[positions] = segments
  return order


def run(
    tokens: np.ndarray,
    settings: PackSettings,
    directory: str,
    *,
    runner: str,
    workers: int,
    extra_options: str = "",
    block_rows: int | None = None,
) -> None:
  """Writes the packed task's cache to ``directory`` with Beam.

  The token stream goes to ``<directory>.inputs/tokens.npy`` for the
  workers (a path they can read: gs:// on Dataflow). A directory left by an
  earlier run is removed first. block_rows: see beam_pipeline.run.
  """
  optional.require("apache_beam", "BM25 packing on Beam")
  optional.require("seqio", "BM25 packing on Beam")
  from memjax.methods.trime import beam_pipeline  # pylint: disable=g-import-not-at-top

  tokens = np.asarray(tokens).reshape(-1)
  s = settings
  inputs = directory.rstrip("/") + ".inputs"
  for path in (directory, inputs):
    if paths.exists(path):
      paths.rmtree(path)
  paths.makedirs(inputs)
  tokens_path = paths.join(inputs, "tokens.npy")
  paths.np_save(tokens_path, tokens)
  stop = list(s.stopword_ids) if s.stopword_ids is not None else None
  beam_pipeline.run(
      tokens_path,
      -(-tokens.size // s.seq_len),
      directory,
      seq_len=s.seq_len,
      k=s.k,
      seed=s.seed,
      stop=stop,
      runner=runner,
      workers=workers,
      extra_options=extra_options,
      completed=json.dumps(dataclasses.asdict(s), sort_keys=True),
      block_rows=block_rows,
  )
  paths.rmtree(inputs)
