"""Tests of memjax.data.streams."""

import numpy as np
import pytest

from memjax.data import streams
from memjax.data import windows


def _arange_stream(n):
  # Token i has id i, so ids double as stream offsets.
  return np.arange(n, dtype=np.int32)


# --- RandomSegments ---------------------------------------------------------


@pytest.mark.parametrize("aligned", [True, False])
def test_random_segments_are_deterministic_and_shifted(aligned):
  tokens = _arange_stream(1000)
  a = streams.RandomSegments(tokens, 16, 4, seed=3, aligned=aligned)
  b = streams.RandomSegments(tokens, 16, 4, seed=3, aligned=aligned)
  other = streams.RandomSegments(tokens, 16, 4, seed=4, aligned=aligned)
  for step in (0, 1, 7, 500):
    x, y = a.batch(step), b.batch(step)
    assert x["inputs"].shape == (4, 16) and x["inputs"].dtype == np.int32
    assert x["targets"].dtype == np.int32
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
    np.testing.assert_array_equal(x["targets"], x["inputs"] + 1)
    np.testing.assert_array_equal(x["inputs"], x["position"])
    assert x["targets"].max() < len(tokens)
  assert not np.array_equal(a.batch(0)["inputs"], a.batch(1)["inputs"])
  assert not np.array_equal(a.batch(0)["inputs"], other.batch(0)["inputs"])
  # Stateless: asking again, out of order, gives the same batch.
  np.testing.assert_array_equal(a.batch(7)["inputs"], b.batch(7)["inputs"])


def test_aligned_segments_visit_each_segment_once_per_epoch():
  tokens = _arange_stream(8 * 10 + 1)  # Exactly 10 segments of 8.
  sampler = streams.RandomSegments(tokens, 8, batch_size=4, seed=0)
  assert sampler.num_segments == 10
  # 5 steps of 4 rows = 2 epochs; the third step straddles them.
  starts = np.concatenate([sampler.starts(s) for s in range(5)])
  assert np.all(starts % 8 == 0)
  for epoch in range(2):
    got = np.sort(starts[10 * epoch : 10 * (epoch + 1)])
    np.testing.assert_array_equal(got, np.arange(10) * 8)
  assert not np.array_equal(starts[:10], starts[10:])


def test_random_segments_need_a_long_enough_stream():
  with pytest.raises(ValueError, match="too short"):
    streams.RandomSegments(_arange_stream(8), 8, 1, seed=0)


# --- ConsecutiveSegments ----------------------------------------------------


@pytest.mark.parametrize("segments_per_lane", [1, 3])
@pytest.mark.parametrize("seed", [0, 5])
def test_consecutive_segments_continue_in_every_lane(segments_per_lane, seed):
  n, seq_len, lanes = 1003, 7, 4
  tokens = _arange_stream(n)
  sampler = streams.ConsecutiveSegments(
      tokens, seq_len, lanes, segments_per_lane, seed=seed
  )
  lane_len = n // lanes
  assert sampler.steps_per_epoch == (lane_len - 1) // seq_len // (
      segments_per_lane
  )
  rows = lanes * segments_per_lane
  spe = sampler.steps_per_epoch
  previous = None
  for step in range(2 * spe + 2):
    batch = sampler.batch(step)
    assert batch["inputs"].shape == (rows, seq_len)
    assert batch["inputs"].dtype == np.int32
    assert batch["position"].dtype == np.int64
    np.testing.assert_array_equal(batch["inputs"], batch["position"])
    np.testing.assert_array_equal(batch["targets"], (batch["position"] + 1) % n)
    np.testing.assert_array_equal(
        batch["lane_id"], np.repeat(np.arange(lanes), segments_per_lane)
    )
    # Within a step, rows of a lane are consecutive (lane-major order).
    pos = batch["position"].reshape(lanes, segments_per_lane * seq_len)
    assert np.all(np.diff(pos, axis=1) % n == 1)
    new_epoch = step % spe == 0
    np.testing.assert_array_equal(batch["reset"], np.full(lanes, new_epoch))
    if previous is not None and not new_epoch:
      # Each lane's first input follows its last input of the last step.
      last = previous["position"].reshape(lanes, -1)[:, -1]
      np.testing.assert_array_equal(pos[:, 0], (last + 1) % n)
    previous = batch
  first_epoch = sampler.batch(0)["position"].reshape(lanes, -1)[:, 0]
  if seed == 0:
    # Transformer-XL's batchify: lane j starts at j * (n // lanes).
    np.testing.assert_array_equal(first_epoch, np.arange(lanes) * lane_len)
    np.testing.assert_array_equal(
        sampler.batch(spe)["position"], sampler.batch(0)["position"]
    )
  else:
    assert not np.array_equal(
        sampler.batch(spe)["position"], sampler.batch(0)["position"]
    )


def test_consecutive_segments_doc_ids():
  tokens = _arange_stream(100)
  doc_starts = np.array([0, 10, 55], np.int64)
  sampler = streams.ConsecutiveSegments(tokens, 5, 2, doc_starts=doc_starts)
  batch = sampler.batch(2)
  expected = np.searchsorted(doc_starts, batch["position"], "right") - 1
  np.testing.assert_array_equal(batch["doc_id"], expected)
  assert batch["doc_id"].dtype == np.int32


def test_consecutive_segments_need_long_enough_lanes():
  with pytest.raises(ValueError, match="too short"):
    streams.ConsecutiveSegments(_arange_stream(40), 10, 4)


# --- eval_windows / eval_batches --------------------------------------------

WINDOW_CASES = [
    (0, 8, 4),
    (1, 8, 4),
    (5, 8, 4),
    (8, 8, 4),
    (9, 8, 4),
    (100, 8, 4),
    (100, 8, 8),
    (100, 8, 1),
    (37, 16, 5),
    (1000, 512, 64),
]


@pytest.mark.parametrize("num_tokens,window_len,score_len", WINDOW_CASES)
def test_eval_windows_score_every_prediction_once(
    num_tokens, window_len, score_len
):
  starts = windows.eval_windows(num_tokens, window_len, score_len)
  assert starts.ndim == 2 and starts.shape[1] == 3
  scored = np.zeros(num_tokens, np.int64)
  for w, (start, length, score_from) in enumerate(starts):
    assert 0 <= start and start + length <= num_tokens
    assert 0 < length <= window_len
    if w == 0:
      assert start == 0 and score_from == 0
      assert length == min(window_len, num_tokens)
    else:
      assert score_from == window_len - score_len
      assert length - score_from <= score_len
    scored[start + score_from : start + length] += 1
  np.testing.assert_array_equal(scored, np.ones(num_tokens))


def test_eval_windows_reject_bad_lengths():
  with pytest.raises(ValueError):
    windows.eval_windows(10, 4, 5)
  with pytest.raises(ValueError):
    windows.eval_windows(10, 4, 0)


@pytest.mark.parametrize(
    "n,window_len,score_len,batch_size",
    [(101, 16, 4, 3), (10, 16, 4, 2), (257, 32, 32, 4)],
)
def test_eval_batches_score_each_prediction_once(
    n, window_len, score_len, batch_size
):
  tokens = np.random.default_rng(0).integers(3, 50, n).astype(np.int32)
  batches = list(
      windows.eval_batches(tokens, window_len, score_len, batch_size)
  )
  num_windows = len(windows.eval_windows(n - 1, window_len, score_len))
  assert len(batches) == -(-num_windows // batch_size)
  scored = np.zeros(n - 1, np.int64)
  total = 0.0
  for batch in batches:
    for key in ("inputs", "targets", "weights", "position"):
      assert batch[key].shape == (batch_size, window_len)
    assert batch["inputs"].dtype == np.int32
    assert batch["weights"].dtype == np.float32
    valid = batch["position"] >= 0
    pos = batch["position"][valid]
    np.testing.assert_array_equal(batch["inputs"][valid], tokens[pos])
    np.testing.assert_array_equal(batch["targets"][valid], tokens[pos + 1])
    assert np.all(batch["weights"][~valid] == 0)
    assert np.all(batch["inputs"][~valid] == 0)
    np.add.at(scored, batch["position"][batch["weights"] > 0], 1)
    total += batch["weights"].sum()
  assert total == n - 1
  np.testing.assert_array_equal(scored, np.ones(n - 1))
  # The last batch is padded with zero-weight rows.
  padding_rows = batch_size * len(batches) - num_windows
  if padding_rows:
    assert np.all(batches[-1]["weights"][-padding_rows:] == 0)


# --- SegmentStream ----------------------------------------------------------


@pytest.mark.parametrize(
    "n,seq_len,lanes", [(101, 8, 3), (50, 7, 1), (5, 8, 4)]
)
def test_segment_stream_covers_every_prediction_once(n, seq_len, lanes):
  tokens = _arange_stream(n)
  stream = windows.SegmentStream(tokens, seq_len, lanes)
  stacked = stream.stacked()
  t = len(stream)
  assert stacked["inputs"].shape == (t, lanes, seq_len)
  assert stacked["reset"].shape == (t, lanes)
  assert stacked["reset"][0].all() and not stacked["reset"][1:].any()
  weights = stacked["weights"]
  assert weights.sum() == n - 1
  positions = stacked["position"][weights > 0]
  np.testing.assert_array_equal(np.sort(positions), np.arange(n - 1))
  valid = weights > 0
  np.testing.assert_array_equal(stacked["inputs"][valid], positions)
  np.testing.assert_array_equal(stacked["targets"][valid], positions + 1)
  # Each lane is read in order: flattened over segments it is consecutive.
  lane_major = stacked["position"].transpose(1, 0, 2).reshape(lanes, -1)
  for lane in lane_major:
    real = lane[lane >= 0]
    assert np.all(np.diff(real) == 1)
