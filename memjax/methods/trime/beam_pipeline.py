"""The Apache Beam pipeline of the BM25 packing (imports Beam and SeqIO).

Imported only when the pipeline runs (``pack_beam.run``), so the rest of
memjax needs neither. The stages:

1. ``search``: work items are ranges of query segments, cut at multiples of
   ``bm25.query_chunk(S)`` so every block of queries is scored exactly as in
   one process. Each worker loads the token stream and builds the bm25s index
   of all S segments once (``DoFn.setup``), then returns the top-k hits of
   its ranges.
2. ``pack``: the neighbour lists are joined in segment order and Algorithm 1
   (``bm25.pack_from_neighbours``, sequential) runs on one worker; it emits
   one example per segment with its packed position.
3. SeqIO's cache format, as ``seqio.scripts.cache_tasks_main`` writes it
   (``seqio.beam_utils``): ``train.tfrecord-*-of-*``, ``info.train.json``,
   ``stats.train.json`` and, last, ``COMPLETED``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
from typing import Any, Iterable, Iterator

import apache_beam as beam
from apache_beam.options import pipeline_options as beam_options
import numpy as np
import seqio
from seqio import beam_utils

from memjax.io import paths
from memjax.methods.trime import bm25
from memjax.methods.trime import bm25_order

SPLIT = "train"


class _SearchRows(beam.DoFn):
  """(lo, hi) -> (lo, [hi - lo, k] top-k hits of segments lo..hi-1)."""

  def __init__(
      self,
      tokens_path: str,
      seq_len: int,
      k: int,
      stop: list[int] | None,
      block_rows: int | None,
  ):
    self._block_rows = block_rows
    self._tokens_path = tokens_path
    self._seq_len = seq_len
    self._k = k
    self._stop = stop
    self._index = None

  def setup(self):
    # Once per worker: the index of all segments (each query scores them all).
    tokens = paths.np_load(self._tokens_path)
    self._index = bm25.build_index(
        bm25.split_segments(tokens, self._seq_len),
        stopword_ids=self._stop,
        show_progress=False,
    )

  def process(self, rows: tuple[int, int]) -> Iterable[tuple[int, np.ndarray]]:
    lo, hi = rows
    yield lo, bm25.search_rows(
        self._index, np.arange(lo, hi), self._k, chunk=self._block_rows
    )


def _pack(
    tables: list[tuple[int, np.ndarray]],
    tokens_path: str,
    seq_len: int,
    seed: int,
) -> Iterable[dict[str, Any]]:
  """Algorithm 1 on the joined lists; one example per segment
  (``bm25_order.segment_examples``)."""
  neighbours = np.concatenate(
      [t for _, t in sorted(tables, key=lambda t: t[0])]
  )
  order, _ = bm25.pack_from_neighbours(neighbours, seed)
  yield from bm25_order.segment_examples(
      order, paths.np_load(tokens_path), seq_len
  )


def work_items(
    num_segments: int, parts: int, block_rows: int | None = None
) -> list[tuple[int, int]]:
  """[lo, hi) query ranges: ~parts of them, cut at whole query blocks."""
  chunk = block_rows or bm25.query_chunk(num_segments)
  blocks = -(-num_segments // chunk)
  cuts = np.array_split(np.arange(blocks), max(1, min(parts, blocks)))
  return [
      (int(c[0]) * chunk, min(int(c[-1] + 1) * chunk, num_segments))
      for c in cuts
      if len(c)
  ]


def options(
    runner: str, workers: int, extra: str
) -> beam_options.PipelineOptions:
  """Beam options: the runner, N local processes, then the user's flags."""
  flags = [f"--runner={runner}"]
  if runner in ("DirectRunner", "direct"):
    flags += [
        f"--direct_num_workers={workers}",
        "--direct_running_mode=multi_processing",
    ]
  return beam_options.PipelineOptions(flags + shlex.split(extra or ""))


@contextlib.contextmanager
def _scratch_tempdir() -> Iterator[str]:
  """Points ``tempfile`` at a directory that is removed afterwards.

  Each run of Beam's DirectRunner leaves folders in the system's temporary
  directory (``beam-temp*``, ``beam-requirements-cache``, ``tmp*``), made
  with ``tempfile`` in this process; they go here instead.
  """
  before = tempfile.tempdir
  with tempfile.TemporaryDirectory(prefix="memjax-beam-") as scratch:
    tempfile.tempdir = scratch
    try:
      yield scratch
    finally:
      tempfile.tempdir = before


def run(
    tokens_path: str,
    num_segments: int,
    output_dir: str,
    *,
    seq_len: int,
    k: int,
    seed: int,
    stop: list[int] | None,
    runner: str,
    workers: int,
    extra_options: str,
    completed: str,
    block_rows: int | None = None,
) -> None:
  """Runs the pipeline and waits for it; output_dir gets SeqIO's cache.

  block_rows: queries per scored block (None: bm25.query_chunk(S), the
  blocks of one process, so the floats and the order are the same).
  """
  num_shards = max(1, workers)
  items = work_items(num_segments, 4 * max(1, workers), block_rows)
  features = {
      "targets": seqio.Feature(seqio.PassThroughVocabulary(1), add_eos=False)
  }
  prefix = seqio.get_cached_tfrecord_prefix(output_dir, SPLIT)
  with (
      _scratch_tempdir(),
      beam.Pipeline(options=options(runner, workers, extra_options)) as p,
  ):
    examples = (
        p
        | "items" >> beam.Create(items)
        | "spread" >> beam.Reshuffle()
        | "search"
        >> beam.ParDo(_SearchRows(tokens_path, seq_len, k, stop, block_rows))
        | "join" >> beam.combiners.ToList()
        | "pack" >> beam.FlatMap(_pack, tokens_path, seq_len, seed)
    )
    done = [
        examples
        | "tfrecord"
        >> beam_utils.WriteExampleTfRecord(prefix, num_shards=num_shards),
        examples
        | "info" >> beam_utils.GetInfo(num_shards)
        | "write_info"
        >> beam_utils.WriteJson(seqio.get_cached_info_path(output_dir, SPLIT)),
        examples
        | "stats" >> beam_utils.GetStats(features)
        | "write_stats"
        >> beam_utils.WriteJson(seqio.get_cached_stats_path(output_dir, SPLIT)),
    ]
    _ = (
        done
        | "flatten" >> beam.Flatten()
        | "nothing" >> beam.Filter(lambda _: False)
        | "completed"
        >> beam.io.textio.WriteToText(
            os.path.join(output_dir, "COMPLETED"),
            append_trailing_newlines=False,
            num_shards=1,
            shard_name_template="",
            header=completed,
        )
    )
