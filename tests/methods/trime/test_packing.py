"""Training batchers of the TRIME memories and the memory-evaluation windows."""

import numpy as np
import pytest

from configs import trime_wt103
from memjax import build
from memjax.methods.trime import bm25
from memjax.methods.trime import bm25_order
from memjax.methods.trime import packing
from memjax.data import streams
from memjax.data import windows
from memjax.data import tasks


def _arange_stream(n):
  return np.arange(n, dtype=np.int32)


def test_random_blocks_hold_consecutive_segments_per_lane():
  tokens = _arange_stream(24 * 10 + 1)  # 10 blocks of 3 segments of 8
  sampler = streams.RandomBlocks(
      tokens, 8, blocks=2, segments_per_block=3, seed=1
  )
  seen = []
  for step in range(5):
    b = sampler.batch(step)
    assert b["inputs"].shape == (6, 8)
    np.testing.assert_array_equal(b["lane_id"], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(b["targets"], b["inputs"] + 1)
    for lane in range(2):
      rows = b["position"][3 * lane : 3 * lane + 3].reshape(-1)
      np.testing.assert_array_equal(
          rows, rows[0] + np.arange(24)
      )  # consecutive
      assert rows[0] % 24 == 0
      seen.append(rows[0] // 24)
  assert sorted(seen) == list(range(10))  # one epoch visits every block once
  np.testing.assert_array_equal(
      sampler.batch(3)["inputs"],
      streams.RandomBlocks(tokens, 8, 2, 3, seed=1).batch(3)["inputs"],
  )


def test_packed_segments_follow_the_order_and_keep_batches_whole():
  tokens = _arange_stream(8 * 12 + 1)  # 12 segments of 8
  order = np.array(
      [5, 3, 11, 0, 7, 2, 9, 1, 4, 10, 8, 6, 12]
  )  # 12 has no target
  sampler = streams.PackedSegments(tokens, 8, 4, order, seed=0)
  assert sampler.steps_per_epoch == 3
  batches = {tuple(order[i : i + 4]) for i in (0, 4, 8)}
  for epoch in range(2):
    got = [tuple(sampler.segments(epoch * 3 + k)) for k in range(3)]
    assert set(got) == batches  # each packed batch once per epoch
  b = sampler.batch(4)
  np.testing.assert_array_equal(b["inputs"][:, 0] // 8, sampler.segments(4))
  np.testing.assert_array_equal(b["targets"], b["inputs"] + 1)
  with pytest.raises(ValueError, match="fewer than one batch"):
    streams.PackedSegments(tokens, 8, 16, order, seed=0)


def test_bm25_batcher_reads_the_cached_order(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  # Four topics with disjoint vocabularies, shuffled segments of 16 tokens.
  segs = [
      rng.integers(100 * t, 100 * t + 30, 16)
      for t in range(4)
      for _ in range(8)
  ]
  perm = rng.permutation(len(segs))
  tokens = np.concatenate(
      [segs[i] for i in perm] + [np.zeros(1, np.int64)]
  ).astype(np.int32)
  cfg = trime_wt103.get_config("trime_ext_smoke")
  cfg.data.seq_len, cfg.data.batch_size, cfg.trime.bm25_k = 16, 8, 5
  stream = tasks.TokenStream(
      tokens=tokens, doc_starts=np.zeros(1, np.int64), vocab_size=400
  )
  settings = build.read(cfg, build.parts())
  batcher = packing.bm25_batcher(settings, stream, str(tmp_path))
  files = list((tmp_path / "bm25").glob("bm25_order_*.npy"))
  assert len(files) == 1
  order = np.load(files[0])
  np.testing.assert_array_equal(
      order,
      bm25.bm25_pack(
          bm25.split_segments(tokens, 16), 8, k=5, seed=0, show_progress=False
      ),
  )
  topic = lambda b: set((b["inputs"] // 100).reshape(-1).tolist())
  pure = sum(
      len(topic(batcher.batch(s))) == 1 for s in range(batcher.steps_per_epoch)
  )
  assert pure >= 3  # BM25 keeps most batches within one topic

  def fail(*args, **kwargs):
    raise AssertionError("recomputed despite the cache")

  # The order is read, not recomputed: any BM25 search now fails.
  for name in ("bm25_pack", "bm25_neighbours"):
    monkeypatch.setattr(bm25, name, fail)
    monkeypatch.setattr(bm25_order, name, fail)
  again = packing.bm25_batcher(settings, stream, str(tmp_path))
  np.testing.assert_array_equal(
      again.batch(2)["inputs"], batcher.batch(2)["inputs"]
  )


@pytest.mark.parametrize(
    "n,window,score", [(40, 8, 4), (41, 8, 3), (5, 8, 4), (30, 6, 6)]
)
def test_memory_windows_score_each_prediction_once_with_eval_windows_context(
    n, window, score
):
  ref = windows.eval_windows(n, window, score)
  context = {}
  for start, length, sfrom in ref:
    for o in range(sfrom, length):
      context[start + o] = start
  rows = windows.memory_eval_windows(n, window, score)
  seen = []
  for start, length, lo, hi in rows:
    assert 0 < hi - lo <= score
    for o in range(lo, hi):
      assert context[start + o] == start  # same window start, so same context
      seen.append(start + o)
  assert sorted(seen) == list(range(n)) == seen
  batches = list(
      windows.memory_eval_batches(np.arange(n + 1), window, score, 3)
  )
  count = np.concatenate([b["score_count"] for b in batches])
  assert count.sum() == n
  b = batches[0]
  np.testing.assert_array_equal(
      b["targets"][b["position"] >= 0], b["position"][b["position"] >= 0] + 1
  )
