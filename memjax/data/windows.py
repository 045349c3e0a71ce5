"""Evaluation layouts of a token stream.

Plain numpy and stateless, with the conventions of ``memjax.data.streams``
(prediction i: input tokens[i], target tokens[i + 1]; batches of 'inputs',
'targets', 'position' and 'weights' [B, L]).

* :func:`eval_windows` / :func:`eval_batches`: overlapping windows, the
  sliding-window evaluation of Baevski & Auli (fairseq --context-window).
* :class:`SegmentStream`: consecutive evaluation segments in lanes, for a
  scan over segments of a recurrent model.
* :func:`memory_eval_windows` / :func:`memory_eval_batches`: the sliding
  windows with at most ``score_len`` scored predictions each, for
  evaluation with testing memories.
* :func:`document_windows` / :func:`document_segments`: the same layouts
  inside documents, each read from its own start (the early-token
  analysis).

Where a model's tokenizer puts BOS before every document (``bos``: an
imported Llama's; None for memjax's own vocabularies), a window whose
first token is not a BOS (one that starts inside a document) and that
scores nothing at its first offset has its first token replaced by BOS
(:func:`begin_with_bos`): the model reads BOS, then ``window_len - 1``
tokens of the stream, as lm-eval-harness's rolling log-likelihood feeds
it. The BOS is context only; which predictions a window scores, and
their targets, are unchanged.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np


def as_stream(tokens: np.ndarray) -> np.ndarray:
  """Checks that ``tokens`` is a 1-D stream and returns it as an array."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 1:
    raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}.")
  return tokens


def check_positive(**kwargs: int) -> None:
  """Raises ValueError naming the first argument below 1."""
  for name, value in kwargs.items():
    if value < 1:
      raise ValueError(f"{name} must be >= 1, got {value}.")


def begin_with_bos(
    inputs: np.ndarray,
    valid: np.ndarray,
    score_from: np.ndarray,
    bos: Optional[int],
) -> np.ndarray:
  """The windows' inputs with BOS first where a window starts inside a
  document (see the module doc).

  Args:
    inputs: [W, T] int32 window inputs.
    valid: [W] bool, False on padding rows.
    score_from: [W] int first scored offset of each window.
    bos: the BOS id, or None (``inputs`` returned as they are).

  Returns:
    [W, T] int32: ``inputs`` with [w, 0] = bos where ``valid[w]``,
    ``score_from[w] >= 1`` and ``inputs[w, 0] != bos``.
  """
  if bos is None:
    return inputs
  inputs = np.array(inputs, np.int32)
  first = valid & (np.asarray(score_from) >= 1) & (inputs[:, 0] != bos)
  inputs[first, 0] = bos
  return inputs


def eval_windows(
    num_tokens: int, window_len: int, score_len: int
) -> np.ndarray:
  """Sliding evaluation windows over a stream of ``num_tokens`` predictions.

  ``num_tokens`` counts predictions (inputs tokens[i], targets
  tokens[i + 1]), i.e. ``len(tokens) - 1``. Window w covers predictions
  [start, start + length) and scores those at offsets >= score_from within
  it. The first window covers up to ``window_len`` predictions and scores
  all of them; each later window scores the next ``score_len`` predictions
  (fewer in the last window) after a context of exactly
  ``window_len - score_len`` predictions. Every prediction is scored
  exactly once. This is the protocol of Baevski & Auli (fairseq eval_lm
  with --context-window): ``window_len`` tokens per window, the last
  ``score_len`` scored. ``score_len == window_len`` gives disjoint blocks.

  Args:
      num_tokens: number of predictions P >= 0.
      window_len: tokens per window.
      score_len: scored tokens per window (1 <= score_len <= window_len).

  Returns:
      [W, 3] int64 rows (start, length, score_from); W = 0 when P = 0.
  """
  check_positive(window_len=window_len, score_len=score_len)
  if score_len > window_len:
    raise ValueError(
        f"score_len ({score_len}) must be <= window_len ({window_len})."
    )
  if num_tokens < 0:
    raise ValueError(f"num_tokens must be >= 0, got {num_tokens}.")
  if num_tokens == 0:
    return np.zeros([0, 3], np.int64)
  context = window_len - score_len
  first = [(0, min(window_len, num_tokens), 0)]
  score_start = np.arange(window_len, num_tokens, score_len, dtype=np.int64)
  score_end = np.minimum(score_start + score_len, num_tokens)
  start = score_start - context
  rest = np.stack(
      [start, score_end - start, np.full_like(start, context)], axis=1
  )
  return np.concatenate([np.asarray(first, np.int64), rest], axis=0)


def eval_batches(
    tokens: np.ndarray,
    window_len: int,
    score_len: int,
    batch_size: int,
    bos: Optional[int] = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Batches of the windows of :func:`eval_windows` over ``tokens``.

  Args:
      tokens: [N] int token stream.
      window_len: window length L.
      score_len: scored predictions per window (after the first).
      batch_size: windows per batch B; the last batch is padded with
          all-padding rows.
      bos: the BOS a window starting inside a document begins with
          (:func:`begin_with_bos`), or None.

  Yields:
      'inputs', 'targets': [B, L] int32 (0 = PAD beyond a window's end).
      'weights': [B, L] float32, 1 on scored predictions, 0 on context and
          padding; over all batches the weights sum to N - 1.
      'position': [B, L] int64 prediction index of each input, -1 on
          padding.
  """
  check_positive(batch_size=batch_size)
  tokens = as_stream(tokens)
  windows = eval_windows(max(len(tokens) - 1, 0), window_len, score_len)
  offsets = np.arange(window_len)
  for first in range(0, len(windows), batch_size):
    rows = windows[first : first + batch_size]
    start, length, score_from = rows[:, 0:1], rows[:, 1:2], rows[:, 2:3]
    valid = np.zeros([batch_size, window_len], bool)
    valid[: len(rows)] = offsets < length
    scored = np.zeros([batch_size, window_len], bool)
    scored[: len(rows)] = (offsets >= score_from) & (offsets < length)
    position = np.full([batch_size, window_len], -1, np.int64)
    position[: len(rows)] = start + offsets
    position[~valid] = -1
    safe = np.where(valid, position, 0)
    inputs = np.where(valid, tokens[safe], 0).astype(np.int32)
    froms = np.zeros([batch_size], np.int64)
    froms[: len(rows)] = rows[:, 2]
    yield {
        "inputs": begin_with_bos(inputs, valid[:, 0], froms, bos),
        "targets": np.where(valid, tokens[safe + 1], 0).astype(np.int32),
        "weights": scored.astype(np.float32),
        "position": position,
    }


class SegmentStream:
  """Consecutive, non-overlapping evaluation segments of a stream in lanes.

  The N - 1 predictions are cut into ``lanes`` contiguous lanes of
  ``ceil((N - 1) / lanes)`` predictions (the last lane may be shorter or
  empty); segment t of every lane covers the next L predictions of the
  lane, padded at the lane's end with zero weight. Every prediction is
  scored exactly once. Row r of segment t + 1 continues row r of segment t,
  so a recurrent model (Transformer-XL memory, long-term memories) can scan
  over ``stacked()`` carrying its state per lane.
  """

  def __init__(self, tokens: np.ndarray, seq_len: int, lanes: int = 1):
    """Creates the stream.

    Args:
        tokens: [N] int token stream.
        seq_len: segment length L.
        lanes: rows per segment.
    """
    check_positive(seq_len=seq_len, lanes=lanes)
    self._tokens = as_stream(tokens)
    self.seq_len = seq_len
    self.lanes = lanes
    self.num_predictions = max(len(self._tokens) - 1, 0)
    self.lane_len = -(-self.num_predictions // lanes)
    self.num_segments = -(-self.lane_len // seq_len)

  def __len__(self) -> int:
    return self.num_segments

  def batch(self, t: int) -> dict[str, np.ndarray]:
    """Returns segment ``t`` (0 <= t < len(self)).

    Returns:
        'inputs', 'targets': [lanes, L] int32 (0 on padding).
        'weights': [lanes, L] float32, 1 on real predictions.
        'position': [lanes, L] int64 prediction index, -1 on padding.
        'reset': [lanes] bool, True for t == 0 (start of every lane).
    """
    if not 0 <= t < self.num_segments:
      raise IndexError(f"segment {t} out of range [0, {len(self)}).")
    in_lane = t * self.seq_len + np.arange(self.seq_len)
    lane_start = np.arange(self.lanes, dtype=np.int64)[:, None]
    position = lane_start * self.lane_len + in_lane
    valid = (in_lane < self.lane_len) & (position < self.num_predictions)
    safe = np.where(valid, position, 0)
    return {
        "inputs": np.where(valid, self._tokens[safe], 0).astype(np.int32),
        "targets": np.where(valid, self._tokens[safe + 1], 0).astype(np.int32),
        "weights": valid.astype(np.float32),
        "position": np.where(valid, position, -1),
        "reset": np.full(self.lanes, t == 0),
    }

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    for t in range(self.num_segments):
      yield self.batch(t)

  def stacked(self) -> dict[str, np.ndarray]:
    """All segments stacked: each array gets a leading [T] axis."""
    batches = list(self)
    if not batches:
      empty = np.zeros([0, self.lanes, self.seq_len])
      return {
          "inputs": empty.astype(np.int32),
          "targets": empty.astype(np.int32),
          "weights": empty.astype(np.float32),
          "position": empty.astype(np.int64),
          "reset": np.zeros([0, self.lanes], bool),
      }
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def memory_eval_windows(
    num_tokens: int, window_len: int, score_len: int
) -> np.ndarray:
  """The windows of :func:`eval_windows`, each scoring <= score_len tokens.

  Evaluation with testing memories scores a fixed number of queries per
  window, so the first window of :func:`eval_windows` (which scores all of
  its up to ``window_len`` predictions) is repeated, each copy scoring the
  next ``score_len`` of them; the other windows are unchanged. Every
  prediction is scored exactly once and with exactly the context it has
  under :func:`eval_windows` (the model is causal, so the copies of the
  first window give the same outputs), so the plain model scores equal
  :func:`eval_batches`'s.

  Args:
      num_tokens: number of predictions P >= 0.
      window_len: tokens per window.
      score_len: scored tokens per window.

  Returns:
      [W, 4] int64 rows (start, length, score_from, score_to): the window
      covers predictions [start, start + length) and scores window offsets
      [score_from, score_to), at most score_len of them.
  """
  windows = eval_windows(num_tokens, window_len, score_len)
  rows = []
  for start, length, score_from in windows:
    for lo in range(int(score_from), int(length), score_len):
      rows.append((start, length, lo, min(lo + score_len, length)))
  if not rows:
    return np.zeros([0, 4], np.int64)
  return np.asarray(rows, np.int64)


def memory_eval_batches(
    tokens: np.ndarray,
    window_len: int,
    score_len: int,
    batch_size: int,
    bos: Optional[int] = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Batches of :func:`memory_eval_windows`, in stream order.

  Args:
      tokens: [N] int token stream.
      window_len: window length T.
      score_len: scored predictions per window S.
      batch_size: windows per batch W; the last batch is padded with rows
          that score nothing.
      bos: the BOS a window starting inside a document begins with
          (:func:`begin_with_bos`; the copies of the first window score
          from their first offset and are left as they are), or None.

  Yields:
      'inputs', 'targets': [W, T] int32 (0 beyond a window's end).
      'position': [W, T] int32 prediction index, -1 on padding.
      'start': [W] int32 first prediction of each window (-1 on padding).
      'score_from': [W] int32 first scored offset in the window.
      'score_count': [W] int32 scored predictions (0 on padding rows); the
          scored offsets are score_from + [0, score_count).
  """
  check_positive(batch_size=batch_size)
  tokens = as_stream(tokens)
  windows = memory_eval_windows(max(len(tokens) - 1, 0), window_len, score_len)
  offsets = np.arange(window_len)
  for first in range(0, len(windows), batch_size):
    rows = windows[first : first + batch_size]
    n = len(rows)
    start, length = rows[:, 0:1], rows[:, 1:2]
    valid = np.zeros([batch_size, window_len], bool)
    valid[:n] = offsets < length
    position = np.full([batch_size, window_len], -1, np.int64)
    position[:n] = start + offsets
    position[~valid] = -1
    safe = np.where(valid, position, 0)
    starts = np.full([batch_size], -1, np.int64)
    starts[:n] = rows[:, 0]
    score_from = np.zeros([batch_size], np.int64)
    score_from[:n] = rows[:, 2]
    count = np.zeros([batch_size], np.int64)
    count[:n] = rows[:, 3] - rows[:, 2]
    inputs = np.where(valid, tokens[safe], 0).astype(np.int32)
    # The context of a window (its original score_from), not its copy's.
    context = np.zeros([batch_size], np.int64)
    context[:n] = np.where(rows[:, 0] > 0, window_len - score_len, 0)
    yield {
        "inputs": begin_with_bos(inputs, valid[:, 0], context, bos),
        "targets": np.where(valid, tokens[safe + 1], 0).astype(np.int32),
        "position": position.astype(np.int32),
        "start": starts.astype(np.int32),
        "score_from": score_from.astype(np.int32),
        "score_count": count.astype(np.int32),
    }


def document_windows(
    tokens: np.ndarray,
    spans: np.ndarray,
    window_len: int,
    score_len: int,
    bos: Optional[int] = None,
) -> dict[str, np.ndarray]:
  """The windows of :func:`eval_windows` inside each document, each
  document read from its own start (no window crosses into another).

  Args:
    tokens: [N] the stream.
    spans: [D, 2] (start, end) of the documents.
    window_len: tokens per window.
    score_len: scored predictions per window (after a document's first).
    bos: the BOS a window starting inside a document begins with
      (:func:`begin_with_bos`), or None.

  Returns:
    inputs, targets [W, window_len] int32; weights [W, window_len] float32
    (1 where scored); positions [W, window_len] int64 (the predicted
    token's offset in its document, 0 where not scored); document [W]
    int64 (the index of each window's document in ``spans``).
  """
  rows = []
  for d, (a, b) in enumerate(spans):
    for s, n, f in eval_windows(int(b - a - 1), window_len, score_len):
      rows.append((a + s, n, f, s, d))
  w = len(rows)
  out = dict(
      inputs=np.zeros((w, window_len), np.int32),
      targets=np.zeros((w, window_len), np.int32),
      weights=np.zeros((w, window_len), np.float32),
      positions=np.zeros((w, window_len), np.int64),
      document=np.asarray([r[4] for r in rows], np.int64),
  )
  for r, (start, n, f, offset, _) in enumerate(rows):
    out["inputs"][r, :n] = tokens[start : start + n]
    out["targets"][r, :n] = tokens[start + 1 : start + n + 1]
    out["weights"][r, f:n] = 1.0
    out["positions"][r, f:n] = offset + np.arange(f, n) + 1
  out["inputs"] = begin_with_bos(
      out["inputs"],
      np.asarray([r[1] > 0 for r in rows], bool),
      np.asarray([r[2] for r in rows], np.int64),
      bos,
  )
  return out


def document_segments(
    tokens: np.ndarray, spans: np.ndarray, segment_len: int, lanes: int
) -> dict[str, np.ndarray]:
  """The documents as lanes, each cut into segments of ``segment_len``.

  Args:
    tokens: [N] the stream.
    spans: [D, 2] (start, end) of at most ``lanes`` documents.
    segment_len: L, predictions per segment.
    lanes: lanes of the result (documents first, then empty lanes).

  Returns:
    inputs, targets [S, lanes, L] int32; weights [S, lanes, L] float32;
    positions [S, lanes, L] int64 (offset of the predicted token in its
    document, 0 where not scored); reset [S, lanes] bool (True at segment 0:
    every document starts from an empty memory).
  """
  n = np.maximum(spans[:, 1] - spans[:, 0] - 1, 0)
  s = max(1, int(-(-n.max() // segment_len))) if len(n) else 1
  shape = (lanes, s * segment_len)
  x, y = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
  w, pos = np.zeros(shape, np.float32), np.zeros(shape, np.int64)
  for d, ((a, _), m) in enumerate(zip(spans, n)):
    x[d, :m], y[d, :m] = tokens[a : a + m], tokens[a + 1 : a + m + 1]
    w[d, :m], pos[d, :m] = 1.0, np.arange(1, m + 1)
  lane_major = lambda v: np.swapaxes(v.reshape(lanes, s, segment_len), 0, 1)
  reset = np.zeros((s, lanes), bool)
  reset[0] = True
  return dict(
      inputs=lane_major(x),
      targets=lane_major(y),
      weights=lane_major(w),
      positions=lane_major(pos),
      reset=reset,
  )


def truncate_windows(
    tokens: np.ndarray, window_len: int, score_len: int, max_windows: int
) -> np.ndarray:
  """The prefix of ``tokens`` that the first ``max_windows`` windows of
  :func:`eval_windows` cover (all of it for 0)."""
  if not max_windows:
    return tokens
  windows = eval_windows(len(tokens) - 1, window_len, score_len)
  last = windows[min(max_windows, len(windows)) - 1]
  return tokens[: int(last[0]) + int(last[1]) + 1]
