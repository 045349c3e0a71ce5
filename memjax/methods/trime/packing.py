"""Training batchers of the TRIME memories: random blocks and BM25 packing.

Both are declared in TRIME's spec (see ``memjax.data.batchers``).

* ``data.batching='blocks'``: b random blocks of m = ``data.segments_per_lane``
  consecutive segments per step (``streams.RandomBlocks``), the in-batch
  long-term memory of TRIMELM_long.
* ``data.batching='bm25'``: segments packed by BM25 (Algorithm 1, k =
  ``trime.bm25_k``), served B per step in the packed order
  (``streams.PackedSegments``), for TRIMELM_ext.

BM25 packing is an offline job whose output the batcher reads. The order is
a pure function of the training tokens, L, k, the seed and the stop words;
``memjax.methods.trime.bm25_order.cached_bm25_order`` stores it in
``<cache_dir>/bm25/bm25_order_<sha256 of tokens and settings>.npy``. Run the
job ahead of training (progress bars on the console):

    python -m memjax.main --config=configs/trime_wt103.py:trime_ext_7m \
        --workdir=runs/ext --mode=pack

or let the first training step compute it (same cache file); every later
run, and every host of a multi-host run, reads the file. For WikiText-103
the search is the expensive part (hours on two CPU cores, see
docs/trime.md); ``--config.pack.runner=DirectRunner
--config.pack.workers=N`` (or DataflowRunner, Flink, Spark) runs it as an
Apache Beam pipeline that writes the packed SeqIO task's cache
(``pack_beam``), which the batcher reads first when it is there.
"""

from __future__ import annotations

import logging
import shlex
import time
from typing import Any

import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.data import batchers
from memjax.data import sources
from memjax.data import streams
from memjax.io import console
from memjax.io import optional
from memjax.io import paths
from memjax.methods.trime import config as trime_config
from memjax.run import spec

Settings = settings_lib.Settings


def stopword_ids(s: Settings, cache_dir: str) -> list[int] | None:
  """Ids of bm25s's English stop words in the word vocabulary, if enabled."""
  d = s.data
  if not s.of(trime_config.Trime).bm25_stopwords:
    return None
  if sources.corpus_spec(d.corpus).level != "word":
    raise errors.ConfigError(
        "trime.bm25_stopwords needs a word-level corpus (wikitext103)"
    )
  import bm25s  # pylint: disable=g-import-not-at-top
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  data_dir = d.data_dir or sources.default_data_dir(d.corpus)
  vocab = vocab_lib.get_vocabulary(d.corpus, data_dir, cache_dir)
  ids = {vocab.token_to_id(w) for w in bm25s.stopwords.STOPWORDS_EN}
  ids.discard(vocab.unk_id)
  return sorted(ids)


def bm25_order(s: Settings, tokens: np.ndarray, cache_dir: str) -> np.ndarray:
  """The packed order of the training segments, computed once and cached.

  Args:
    s: the run's settings (data.seq_len, batch_size, bm25_*).
    tokens: [N] training token stream.
    cache_dir: the run's cache directory; the order goes to ``<cache_dir>/bm25``.

  Returns:
    [ceil(N / L)] int64 segment indices in packing order.
  """
  from memjax.methods.trime import bm25_order  # pylint: disable=g-import-not-at-top

  d, b = s.data, s.of(trime_config.Trime)
  if int(b.bm25_k) < 1:
    raise errors.ConfigError(f"trime.bm25_k must be >= 1, got {b.bm25_k}")
  start = time.time()
  # The settings, their key (a hash of every token) and the task's place:
  # worked out once for the .npy order, the Beam cache and the packing.
  where = _task_location(s, tokens, cache_dir)
  settings, key = where[0], where[1]
  bm25_dir = paths.join(cache_dir, "bm25")
  num_segments = -(-len(tokens) // int(d.seq_len))
  # The .npy order first: it loads in milliseconds, where the SeqIO cache
  # is read back record by record through TensorFlow.
  order = bm25_order.read_cached(bm25_dir, key, num_segments)
  if order is not None:
    console.info(
        "BM25 order read from %s", bm25_order.order_path(bm25_dir, key)
    )
    return order
  order = _beam_cached_order(tokens, cache_dir, where)
  if order is not None:
    # Kept as the .npy order too: later starts read it in milliseconds.
    bm25_order.save(bm25_dir, key, order)
    return order
  console.info(
      "BM25 packing: %d segments of %d tokens, k=%d (cached in %s)",
      -(-len(tokens) // d.seq_len),
      d.seq_len,
      b.bm25_k,
      paths.join(cache_dir, "bm25"),
  )
  order = bm25_order.cached_bm25_order(
      tokens,
      d.seq_len,
      d.batch_size,
      k=int(b.bm25_k),
      seed=int(b.bm25_seed),
      cache_dir=bm25_dir,
      stopword_ids=settings.stopword_ids,
      show_progress=True,
      key=key,
  )
  console.info(
      "BM25 order ready: %d segments in %.1fs", len(order), time.time() - start
  )
  return order


def _pack_settings(s: Settings, cache_dir: str) -> Any:
  """The ``pack_beam.PackSettings`` of the run."""
  from memjax.methods.trime import pack_beam  # pylint: disable=g-import-not-at-top

  b = s.of(trime_config.Trime)
  stop = stopword_ids(s, cache_dir)
  return pack_beam.PackSettings(
      int(s.data.seq_len),
      int(b.bm25_k),
      int(b.bm25_seed),
      tuple(stop) if stop is not None else None,
  )


def _task_location(
    s: Settings, tokens: np.ndarray, cache_dir: str
) -> tuple[Any, str, str, str]:
  """(PackSettings, the order's key, task name, cache directory) of the
  packed order and its SeqIO task."""
  from memjax.methods.trime import pack_beam  # pylint: disable=g-import-not-at-top

  settings = _pack_settings(s, cache_dir)
  key = pack_beam.order_key(tokens, settings)
  name = pack_beam.task_name(s.data.corpus, tokens, settings, key)
  return settings, key, name, pack_beam.task_dir(cache_dir, name)


def _read_cached(
    task: Any, num_segments: int, directory: str, instead: str
) -> np.ndarray | None:
  """The order in the task's cache, or None after one warning line saying
  the cache is partial or unreadable and what happens ``instead``."""
  from memjax.methods.trime import pack_beam  # pylint: disable=g-import-not-at-top

  try:
    return pack_beam.read_order(task, num_segments, directory)
  except pack_beam.CacheError as e:
    console.warn("%s: %s", e, instead)
    return None


def _beam_cached_order(
    tokens: np.ndarray, cache_dir: str, where: tuple[Any, str, str, str]
) -> np.ndarray | None:
  """The order from the packed SeqIO task's Beam cache, if there is one.

  A partial or unreadable cache is one warning line; the in-process order
  is used instead. Without the cache nothing is imported (SeqIO included).
  ``where``: ``_task_location``'s answer.
  """
  settings, _, name, directory = where
  if not paths.exists(directory):
    return None
  from memjax.methods.trime import pack_beam  # pylint: disable=g-import-not-at-top

  task = pack_beam.register_task(name, tokens, settings, cache_dir)
  order = _read_cached(
      task,
      -(-len(tokens) // settings.seq_len),
      directory,
      "packing in process instead (--mode=pack with --config.pack.runner "
      "rebuilds it)",
  )
  if order is not None:
    console.info("BM25 order read from the SeqIO task %s", name)
  return order


def block_shapes(s: Settings, devices: int) -> batchers.BatchShapes:
  """'inputs', 'targets' [B, L] int32 and 'lane_id' [B] int32."""
  out = batchers.segment_shapes(s, devices)
  out["lane_id"] = ((int(s.data.batch_size),), "int32")
  return out


def blocks_batcher(
    s: Settings, train: Any, cache_dir: str
) -> streams.RandomBlocks:
  """b random blocks of m = ``data.segments_per_lane`` consecutive segments
  per step (TRIMELM_long's in-batch long-term memory)."""
  del cache_dir
  d = s.data
  return streams.RandomBlocks(
      train.tokens,
      d.seq_len,
      batchers.lanes_of(d),
      int(d.segments_per_lane),
      seed=s.seed,
  )


def bm25_batcher(
    s: Settings, train: Any, cache_dir: str
) -> streams.PackedSegments:
  """Segments in the BM25 packed order (TRIMELM_ext), read from (or first
  written to) ``<cache_dir>/bm25``."""
  d = s.data
  order = bm25_order(s, train.tokens, cache_dir)
  return streams.PackedSegments(
      train.tokens, d.seq_len, d.batch_size, order, seed=s.seed
  )


def check_pack(s: Settings) -> None:
  """``--mode=pack``'s settings, checked before anything is written: a run
  that batches by BM25, at least one worker, a Beam runner Beam knows and
  pipeline options it parses.

  Raises:
    errors.ConfigError: naming the key to fix.
  """
  if s.data.batching != "bm25":
    raise errors.ConfigError(
        "--mode=pack writes the BM25 order that data.batching='bm25' trains "
        f"on; this run's data.batching is {s.data.batching!r}: set "
        "--config.data.batching=bm25 (a trime_long variant) or skip pack"
    )
  p = s.of(trime_config.Pack)
  if int(p.workers) < 1:
    raise errors.ConfigError(f"pack.workers must be >= 1, got {p.workers}")
  if not p.runner:
    return
  # Beam warns while it loads its runners and parses options; the answer
  # here is the one line below.
  logging.disable(logging.WARNING)
  try:
    optional.require("apache_beam", "BM25 packing on Beam")
    from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
    from apache_beam.runners import runner as beam_runner  # pylint: disable=g-import-not-at-top

    try:
      beam_runner.create_runner(p.runner)
    except ValueError as e:
      valid = str(e).split("Valid values are ")[-1].rstrip(".")
      raise errors.ConfigError(
          f"pack.runner {p.runner!r} is not a Beam runner; valid are {valid}"
      ) from None
    opts = pipeline_options.PipelineOptions(shlex.split(p.options or ""))
    unknown = set(opts.get_all_options(retain_unknown_options=True)) - set(
        opts.get_all_options(retain_unknown_options=False)
    )
  finally:
    logging.disable(logging.NOTSET)
  if unknown:
    raise errors.ConfigError(
        f"pack.options names options Beam does not know: {sorted(unknown)}; "
        "check their spelling (python -m apache_beam.examples.wordcount "
        "--help lists Beam's options)"
    )


def _pack_with_beam(
    s: Settings,
    tokens: np.ndarray,
    cache_dir: str,
    vocabulary: Any,
) -> tuple[np.ndarray, dict[str, Any]]:
  """Writes (or reuses) the packed task's Beam cache; returns its order."""
  from memjax.methods.trime import pack_beam  # pylint: disable=g-import-not-at-top

  p = s.of(trime_config.Pack)
  settings, _, name, directory = _task_location(s, tokens, cache_dir)
  task = pack_beam.register_task(name, tokens, settings, cache_dir, vocabulary)
  num_segments = -(-len(tokens) // settings.seq_len)
  if paths.exists(directory):
    order = _read_cached(task, num_segments, directory, "rebuilding it")
    if order is not None:
      console.info(
          "BM25-packed task %s is already cached in %s", name, directory
      )
      return order, {"task": name, "task_dir": directory, "reused": True}
  console.info(
      "BM25 packing on Beam (%s, %d workers): %d segments into %s",
      p.runner,
      int(p.workers),
      num_segments,
      directory,
  )
  pack_beam.run(
      tokens,
      settings,
      directory,
      runner=p.runner,
      workers=int(p.workers),
      extra_options=p.options,
  )
  order = pack_beam.read_order(task, num_segments, directory)
  return order, {"task": name, "task_dir": directory, "reused": False}


def pack(run: spec.Run) -> dict[str, Any]:
  """The offline packing job (``--mode=pack``): writes the BM25 order.

  Reads the training split through its SeqIO task and runs Algorithm 1:
  in this process into the cache directory that training reads, or with
  ``pack.runner`` set, as a Beam pipeline that writes the packed SeqIO task's
  cache (``pack_beam``). Writes ``<workdir>/bm25_pack.json`` (counts,
  timing and, with Beam, the task's name and directory).
  """
  from memjax.data import tasks  # pylint: disable=g-import-not-at-top

  s, workdir = run.settings, run.workdir
  d, b, p = s.data, s.of(trime_config.Trime), s.of(trime_config.Pack)
  check_pack(s)  # Before anything is tokenised or written.
  data_dir = d.data_dir or sources.default_data_dir(d.corpus)
  cache_dir = d.cache_dir or paths.join(workdir, "cache")
  paths.makedirs(cache_dir)
  train = tasks.load_token_stream(d.corpus, data_dir, "train", cache_dir)
  start = time.time()
  beam = {}
  if p.runner:
    vocabulary = (
        tasks.register_lm_task(d.corpus, data_dir, cache_dir)
        .output_features["targets"]
        .vocabulary
    )
    order, beam = _pack_with_beam(s, train.tokens, cache_dir, vocabulary)
  else:
    order = bm25_order(s, train.tokens, cache_dir)
  batcher = streams.PackedSegments(
      train.tokens, d.seq_len, d.batch_size, order, seed=s.seed
  )
  summary = {
      "segments": int(len(order)),
      "batches_per_epoch": batcher.num_batches,
      "seq_len": int(d.seq_len),
      "batch_size": int(d.batch_size),
      "k": int(b.bm25_k),
      "seed": int(b.bm25_seed),
      "stopwords": bool(b.bm25_stopwords),
      "seconds": time.time() - start,
      "cache_dir": paths.join(cache_dir, "bm25"),
      "runner": p.runner or "in-process",
      **beam,
  }
  paths.makedirs(workdir)
  path = paths.join(workdir, "bm25_pack.json")
  paths.write_json(path, summary)
  where = (
      f"SeqIO task {beam['task']} cached in {beam['task_dir']}"
      if beam
      else summary["cache_dir"]
  )
  return {
      **summary,
      "results_path": path,
      "summary_lines": [
          f"BM25 order of {len(order)} segments "
          f"({batcher.num_batches} batches of {d.batch_size}) in {where}"
      ],
  }
