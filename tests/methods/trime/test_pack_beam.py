"""BM25 packing on Apache Beam (DirectRunner, 2 workers) as a SeqIO task.

One pipeline run (module fixture; Beam's start-up dominates) serves every
test: its order must be the in-process order exactly. The workers are
threads (9 s here, against 26 s for 2 processes, which import TensorFlow
each); benchmarks/bm25_packing.py runs the same pipeline on 2 processes and
checks the same order.
"""

import glob
import json
import os
import shutil
import tempfile

import numpy as np
import pytest

from configs import trime_wt103
from memjax import build
from memjax.data import sources
from memjax.data import tasks
from memjax.methods.trime import bm25
from memjax.methods.trime import bm25_order
from memjax.methods.trime import pack_beam
from memjax.methods.trime import packing

from tests.conftest import run_main  # pylint: disable=g-import-not-at-top,wrong-import-position

SEQ_LEN, BATCH, K = 16, 8, 5


def _topic_corpus() -> np.ndarray:
  """4 topics with disjoint vocabularies, 8 shuffled segments of 16 each."""
  rng = np.random.default_rng(0)
  segs = [
      rng.integers(100 * t, 100 * t + 30, SEQ_LEN)
      for t in range(4)
      for _ in range(8)
  ]
  perm = rng.permutation(len(segs))
  return np.concatenate(
      [segs[i] for i in perm] + [np.zeros(1, np.int64)]
  ).astype(np.int32)


def _config():
  cfg = trime_wt103.get_config("trime_ext_smoke")
  cfg.data.seq_len, cfg.data.batch_size, cfg.trime.bm25_k = SEQ_LEN, BATCH, K
  return cfg


def _settings(cfg):
  """The typed settings the packing functions take, of config ``cfg``."""
  return build.read(cfg, build.parts())


SETTINGS = pack_beam.PackSettings(SEQ_LEN, K, 0)


@pytest.fixture(scope="module")
def beam_cache(tmp_path_factory):
  """(cache_dir, task name, task dir) of one Beam run with 2 workers."""
  cache_dir = str(tmp_path_factory.mktemp("beam_cache"))
  tokens = _topic_corpus()
  name = pack_beam.task_name("wikitext103", tokens, SETTINGS)
  directory = pack_beam.task_dir(cache_dir, name)
  before = set(glob.glob(os.path.join(tempfile.gettempdir(), "beam-*")))
  # 8 queries per block: 5 work items over the 2 worker processes.
  pack_beam.run(
      tokens,
      SETTINGS,
      directory,
      runner="DirectRunner",
      workers=2,
      block_rows=8,
      extra_options="--direct_running_mode=multi_threading",
  )
  after = set(glob.glob(os.path.join(tempfile.gettempdir(), "beam-*")))
  _LEFT_IN_TMP["beam_cache"] = after - before
  return cache_dir, name, directory


# What the Beam run of `beam_cache` left in the system's temporary directory.
_LEFT_IN_TMP = {}


def test_beam_leaves_nothing_in_the_temporary_directory(beam_cache):
  del beam_cache  # Its run is what is checked.
  assert _LEFT_IN_TMP["beam_cache"] == set()


def _in_process_order(tokens):
  return bm25.bm25_pack(
      bm25.split_segments(tokens, SEQ_LEN),
      BATCH,
      k=K,
      seed=0,
      show_progress=False,
  )


def test_beam_packing_is_the_in_process_packing(beam_cache):
  cache_dir, name, directory = beam_cache
  tokens = _topic_corpus()
  task = pack_beam.register_task(name, tokens, SETTINGS, cache_dir)
  order = pack_beam.read_order(task, 33, directory)
  np.testing.assert_array_equal(order, _in_process_order(tokens))
  topics = [
      {
          int(t) // 100
          for s in order[b : b + BATCH]
          for t in tokens[s * SEQ_LEN : (s + 1) * SEQ_LEN]
      }
      for b in range(0, 32, BATCH)
  ]
  assert sum(len(t) == 1 for t in topics) >= 3  # topics stay in one batch
  assert sorted(os.listdir(directory)) == [
      "COMPLETED",
      "info.train.json",
      "stats.train.json",
      "train.tfrecord-00000-of-00002",
      "train.tfrecord-00001-of-00002",
  ]
  assert not os.path.exists(directory + ".inputs")


def test_cached_task_reads_back_through_seqio(beam_cache):
  cache_dir, name, _ = beam_cache
  tokens = _topic_corpus()
  task = pack_beam.register_task(name, tokens, SETTINGS, cache_dir)
  cached = list(
      task.get_dataset(
          split="train", use_cached=True, shuffle=False
      ).as_numpy_iterator()
  )
  cached.sort(key=lambda ex: ex["packed_position"])
  assert [int(ex["packed_position"]) for ex in cached] == list(range(33))
  for ex in cached:
    s = int(ex["segment_id"])
    np.testing.assert_array_equal(
        ex["targets"], tokens[s * SEQ_LEN : (s + 1) * SEQ_LEN]
    )
  # Uncached, the same task packs in process, in packed order.
  fresh = list(
      task.get_dataset(
          split="train", use_cached=False, shuffle=False
      ).as_numpy_iterator()
  )
  assert [int(ex["segment_id"]) for ex in fresh] == [
      int(ex["segment_id"]) for ex in cached
  ]
  assert task.get_cached_stats("train") == {  # seqio counts no id 0 (pad)
      "examples": 33,
      "targets_tokens": int(np.sum(tokens != 0)),
      "targets_max_tokens": SEQ_LEN,
  }


def _stream(tokens):
  return tasks.TokenStream(
      tokens=tokens, doc_starts=np.zeros(1, np.int64), vocab_size=400
  )


def test_bm25_batcher_serves_the_same_batches_from_either_source(
    beam_cache, tmp_path, monkeypatch
):
  cache_dir, _, _ = beam_cache
  stream, cfg = _stream(_topic_corpus()), _settings(_config())
  in_process = packing.bm25_batcher(cfg, stream, str(tmp_path))

  def fail(*args, **kwargs):
    raise AssertionError("searched despite the Beam cache")

  for name in ("bm25_pack", "bm25_neighbours"):
    monkeypatch.setattr(bm25, name, fail)
    monkeypatch.setattr(bm25_order, name, fail)
  from_beam = packing.bm25_batcher(cfg, stream, cache_dir)
  assert not os.path.exists(os.path.join(cache_dir, "bm25", "bm25_order_"))
  for step in range(2 * in_process.steps_per_epoch):
    for key in ("inputs", "targets"):
      np.testing.assert_array_equal(
          from_beam.batch(step)[key], in_process.batch(step)[key]
      )
  # The first read also kept the order as the .npy order: the next start
  # reads that, not the SeqIO records.
  monkeypatch.setattr(pack_beam, "read_order", fail)
  again = packing.bm25_batcher(cfg, stream, cache_dir)
  np.testing.assert_array_equal(again.batches, from_beam.batches)


def _damage(directory: str, damage: str) -> str:
  """Damages a copied cache; returns the words its warning line must hold.

  Beam spreads the records over the two shards as it likes, so the damage
  goes to the larger shard, and cuts where the outcome does not depend on
  the record sizes: inside the first record's payload, after its 12-byte
  header (TensorFlow reports a truncated record; a cut inside a header it
  reads as the end of the file), or at offset 0 (a well-formed but empty
  shard: records are missing).
  """
  if damage == "partial":
    os.remove(os.path.join(directory, "COMPLETED"))
    return "partial"
  shards = sorted(
      glob.glob(os.path.join(directory, "train.tfrecord-*")),
      key=os.path.getsize,
  )
  with open(shards[-1], "r+b") as f:
    f.truncate(20 if damage == "truncated" else 0)
  return "unreadable" if damage == "truncated" else "not a permutation"


@pytest.mark.parametrize("damage", ["partial", "truncated", "records_lost"])
def test_damaged_cache_is_one_line_and_packing_rebuilds_it(
    beam_cache, tmp_path, monkeypatch, capsys, damage
):
  good_cache, name, good_dir = beam_cache
  cache_dir = str(tmp_path)
  directory = pack_beam.task_dir(cache_dir, name)
  shutil.copytree(good_dir, directory)
  words = _damage(directory, damage)
  tokens = _topic_corpus()
  stream, cfg = _stream(tokens), _config()
  # The batcher: one warning line, then the in-process order.
  batcher = packing.bm25_batcher(_settings(cfg), stream, cache_dir)
  lines = [l for l in capsys.readouterr().err.splitlines() if "BM25 cache" in l]
  assert len(lines) == 1 and directory in lines[0], lines
  assert words in lines[0], lines
  ref = _in_process_order(tokens)
  np.testing.assert_array_equal(
      batcher.batches.reshape(-1), ref[ref < 32]  # segment 32 has no target
  )
  # --mode=pack's Beam path: one line, then the pipeline writes it anew
  # (here a stand-in that copies the good cache: Beam already ran once).
  calls = []

  def rerun(tokens_, settings, out_dir, **kwargs):
    calls.append(out_dir)
    shutil.rmtree(out_dir)
    shutil.copytree(good_dir, out_dir)

  monkeypatch.setattr(pack_beam, "run", rerun)
  cfg.pack.runner = "DirectRunner"
  settings = _settings(cfg)
  order, info = packing._pack_with_beam(settings, tokens, cache_dir, None)
  assert calls == [directory] and not info["reused"]
  assert "rebuilding it" in capsys.readouterr().err
  np.testing.assert_array_equal(order, _in_process_order(tokens))
  # Now whole: reused without running anything.
  _, info = packing._pack_with_beam(settings, tokens, cache_dir, None)
  assert info["reused"] and calls == [directory]


def test_corrupt_in_process_order_is_recomputed(tmp_path, caplog):
  tokens = _topic_corpus()
  first = bm25_order.cached_bm25_order(
      tokens, SEQ_LEN, BATCH, k=K, cache_dir=tmp_path, show_progress=False
  )
  (path,) = tmp_path.glob("bm25_order_*.npy")
  path.write_bytes(b"not an array")
  again = bm25_order.cached_bm25_order(
      tokens, SEQ_LEN, BATCH, k=K, cache_dir=tmp_path, show_progress=False
  )
  np.testing.assert_array_equal(again, first)
  assert any("unreadable" in r.message for r in caplog.records)
  np.testing.assert_array_equal(np.load(path), first)


def test_main_packs_on_beam_then_trains_in_the_same_workdir(tmp_path):
  """`--mode=pack` with a Beam runner through memjax.main, then training in
  the same workdir reads the packed task; its order is the in-process one."""
  work = str(tmp_path / "run")
  flags = [
      "--config=configs/trime_wt103.py:trime_ext_smoke",
      f"--workdir={work}",
      "--config.data.seq_len=256",
      "--config.model.max_len=256",
      "--config.eval.window_len=256",
      "--config.eval.score_len=128",
      "--config.eval.max_windows=4",
      "--config.train.eval_every=0",
  ]
  proc = run_main(
      *flags,
      "--mode=pack",
      "--config.pack.runner=DirectRunner",
      "--config.pack.workers=2",
      "--config.pack.options=--direct_running_mode=multi_threading",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.load(open(os.path.join(work, "bm25_pack.json")))
  assert summary["runner"] == "DirectRunner" and not summary["reused"]
  assert summary["task"].startswith("memjax_bm25_wikitext103_")
  proc = run_main(*flags, "--config.train.num_steps=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"BM25 order read from the SeqIO task {summary['task']}" in (
      proc.stdout + proc.stderr
  )
  cfg = trime_wt103.get_config("trime_ext_smoke")
  cfg.data.seq_len = 256
  settings = _settings(cfg)
  cache = os.path.join(work, "cache")
  tokens = tasks.load_token_stream(
      "wikitext103", sources.default_data_dir("wikitext103"), "train", cache
  ).tokens
  task = pack_beam.register_task(
      summary["task"], tokens, packing._pack_settings(settings, cache), cache
  )  # pylint: disable=protected-access
  order = pack_beam.read_order(task, summary["segments"], summary["task_dir"])
  in_process = packing.bm25_order(
      settings, tokens, str(tmp_path / "in_process")
  )
  np.testing.assert_array_equal(order, in_process)
