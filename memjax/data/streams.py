"""Batches of a token stream for training and evaluation.

Everything here is plain numpy and stateless: a batch is a pure function of
(stream, settings, seed, step), so the data position of a run is just the
step number that the checkpoint already saves. The shuffles are small index
permutations, so they are written here with ``np.random.default_rng`` rather
than with tf.data, whose iterator state would have to be checkpointed.

Conventions for a stream ``tokens`` [N]: prediction i has input tokens[i] and
target tokens[i + 1], so a stream has N - 1 predictions. Batches are dicts of
numpy arrays:

* 'inputs'  [B, L] int32: input ids.
* 'targets' [B, L] int32: next-token ids.
* 'position' [B, L] int64: stream offset of each input (prediction index);
  -1 on padding.
* 'weights' [B, L] float32 (evaluation only): 1 where a prediction is scored.

Samplers:

* :class:`RandomSegments`: independent segments for models without
  recurrence (TRIME's in-batch memory, product-key memory).
* :class:`ConsecutiveSegments`: Transformer-XL's lane layout, where each row
  continues the row of the previous step (recurrent memory, TRIME_long).
* :class:`RandomBlocks`: b random blocks of m consecutive segments per step
  (TRIME_long's in-batch long-term memory, batches independent across steps).
* :class:`PackedSegments`: segments in a precomputed order, B per step (the
  BM25 packing of TRIME_ext).

The evaluation layouts (sliding windows, lanes of consecutive segments,
windows with a memory of earlier tokens) are in ``memjax.data.windows`` and
re-exported here.
"""

from __future__ import annotations


import numpy as np

from memjax import errors
from memjax.data.windows import as_stream as _as_stream
from memjax.data.windows import check_positive as _check_positive


class RandomSegments:
  """Segments of length L at random starts, B per step.

  Two sampling modes:

  * ``aligned=True`` (default): the stream is cut into the
    ``(N - 1) // L`` segments starting at multiples of L (fairseq's
    ``--sample-break-mode none``); the segments are visited in an order
    drawn from ``(seed, epoch)``, B per step, epochs following each other
    without gaps, so each token is trained once per epoch. A batch may
    straddle two epochs.
  * ``aligned=False``: each row starts at an independent uniform offset in
    [0, N - L - 1], drawn from ``(seed, step)``.

  Either way ``batch(step)`` depends only on (tokens, settings, seed, step).
  """

  def __init__(
      self,
      tokens: np.ndarray,
      seq_len: int,
      batch_size: int,
      seed: int,
      aligned: bool = True,
  ):
    """Creates the sampler.

    Args:
        tokens: [N] int token stream.
        seq_len: segment length L.
        batch_size: rows per step B.
        seed: non-negative random seed.
        aligned: sampling mode (see the class docstring).

    Raises:
        ValueError: the stream is shorter than L + 1 tokens.
    """
    _check_positive(seq_len=seq_len, batch_size=batch_size)
    self._tokens = _as_stream(tokens)
    self.seq_len = seq_len
    self.batch_size = batch_size
    self.seed = seed
    self.aligned = aligned
    self.num_segments = (len(self._tokens) - 1) // seq_len
    if self.num_segments < 1:
      raise errors.ConfigError(
          f"A stream of {len(self._tokens)} tokens is too short for "
          f"segments of {seq_len} (needs at least {seq_len + 1})."
      )
    self._perm_cache: dict[int, np.ndarray] = {}

  @property
  def steps_per_epoch(self) -> int:
    """Steps that cover the stream about once (at least 1)."""
    return max(self.num_segments // self.batch_size, 1)

  def epoch_order(self, epoch: int) -> np.ndarray:
    """[num_segments] int64: order of aligned segments in ``epoch``."""
    if epoch not in self._perm_cache:
      if len(self._perm_cache) >= 2:
        self._perm_cache.pop(min(self._perm_cache))
      rng = np.random.default_rng([self.seed, epoch])
      self._perm_cache[epoch] = rng.permutation(self.num_segments)
    return self._perm_cache[epoch]

  def starts(self, step: int) -> np.ndarray:
    """[B] int64 stream offsets of the segments of ``step``."""
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}.")
    if not self.aligned:
      rng = np.random.default_rng([self.seed, step])
      high = len(self._tokens) - self.seq_len  # s + L + 1 <= N.
      return rng.integers(0, high, size=self.batch_size, dtype=np.int64)
    index = step * self.batch_size + np.arange(self.batch_size)
    epochs, within = np.divmod(index, self.num_segments)
    out = np.empty(self.batch_size, np.int64)
    for epoch in np.unique(epochs):
      rows = epochs == epoch
      out[rows] = self.epoch_order(int(epoch))[within[rows]]
    return out * self.seq_len

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """Returns 'inputs', 'targets' [B, L] int32, 'position' [B, L] int64."""
    position = self.starts(step)[:, None] + np.arange(self.seq_len)
    return {
        "inputs": self._tokens[position].astype(np.int32),
        "targets": self._tokens[position + 1].astype(np.int32),
        "position": position,
    }


class ConsecutiveSegments:
  """Transformer-XL's training layout: consecutive segments in lanes.

  The stream is cut into ``lanes`` contiguous lanes of ``N // lanes``
  tokens (Transformer-XL's ``batchify``; the last ``N % lanes`` tokens are
  left out). Each step takes the next ``segments_per_lane`` segments of
  length L of every lane, so row r of step k + 1 continues row r of step k
  (with ``segments_per_lane`` S > 1, the first segment of a lane continues
  the last one of that lane in the previous step). Rows are lane-major:
  lane 0's S consecutive segments, then lane 1's, and so on.

  A lane holds ``(N // lanes - 1) // L`` full segments; an epoch is
  ``steps_per_epoch`` steps and the partial tail of each lane is skipped.
  After an epoch every lane starts over ('reset' is True). With ``seed=0``
  every epoch has the same layout; with ``seed > 0`` the stream of each
  epoch (the first included) is rotated by an offset drawn from
  ``(seed, epoch)``, which moves lane and segment boundaries (offsets wrap
  around the end of the stream, so a lane may run from the stream's end
  into its start).
  """

  def __init__(
      self,
      tokens: np.ndarray,
      seq_len: int,
      lanes: int,
      segments_per_lane: int = 1,
      seed: int = 0,
      doc_starts: np.ndarray | None = None,
  ):
    """Creates the sampler.

    Args:
        tokens: [N] int token stream.
        seq_len: segment length L.
        lanes: number of lanes (the batch size of Transformer-XL).
        segments_per_lane: consecutive segments of a lane per step (S).
        seed: 0 for the fixed layout, > 0 for a rotation per epoch.
        doc_starts: optional [D] int64 document start offsets; when given,
            batches also hold 'doc_id'.

    Raises:
        ValueError: the lanes are too short for one step.
    """
    _check_positive(
        seq_len=seq_len, lanes=lanes, segments_per_lane=segments_per_lane
    )
    self._tokens = _as_stream(tokens)
    self.seq_len = seq_len
    self.lanes = lanes
    self.segments_per_lane = segments_per_lane
    self.seed = seed
    self.doc_starts = None if doc_starts is None else np.asarray(doc_starts)
    self.lane_len = len(self._tokens) // lanes
    self.segments_per_epoch = max(self.lane_len - 1, 0) // seq_len
    self._steps_per_epoch = self.segments_per_epoch // segments_per_lane
    if self._steps_per_epoch < 1:
      raise errors.ConfigError(
          f"A stream of {len(self._tokens)} tokens in {lanes} lanes has "
          f"lanes of {self.lane_len} tokens, too short for "
          f"{segments_per_lane} segment(s) of {seq_len} (needs "
          f"{segments_per_lane * seq_len + 1} per lane)."
      )

  @property
  def steps_per_epoch(self) -> int:
    """Steps until every lane starts over."""
    return self._steps_per_epoch

  @property
  def rows(self) -> int:
    """Rows per batch: lanes * segments_per_lane."""
    return self.lanes * self.segments_per_lane

  def epoch_offset(self, epoch: int) -> int:
    """Rotation of the stream in ``epoch`` (0 when seed == 0)."""
    if self.seed == 0:
      return 0
    rng = np.random.default_rng([self.seed, epoch])
    return int(rng.integers(0, len(self._tokens)))

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """Returns the batch of ``step``.

    Returns:
        'inputs', 'targets': [R, L] int32 with R = lanes * S, lane-major.
        'position': [R, L] int64 stream offsets of the inputs (targets are
            at position + 1, modulo N).
        'reset': [lanes] bool, True where the lane starts over (step 0 and
            the first step of every epoch).
        'lane_id': [R] int32 lane of each row.
        'doc_id': [R, L] int32 document of each input token (only with
            doc_starts).
    """
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}.")
    n = len(self._tokens)
    epoch, k = divmod(step, self._steps_per_epoch)
    lane_start = (
        self.epoch_offset(epoch)
        + np.arange(self.lanes, dtype=np.int64) * self.lane_len
    )
    segment = k * self.segments_per_lane + np.arange(self.segments_per_lane)
    row_start = lane_start[:, None] + segment[None, :] * self.seq_len
    position = row_start.reshape(-1, 1) + np.arange(self.seq_len)
    position %= n
    out = {
        "inputs": self._tokens[position].astype(np.int32),
        "targets": self._tokens[(position + 1) % n].astype(np.int32),
        "position": position,
        "reset": np.full(self.lanes, k == 0),
        "lane_id": np.repeat(
            np.arange(self.lanes, dtype=np.int32), self.segments_per_lane
        ),
    }
    if self.doc_starts is not None:
      out["doc_id"] = (
          np.searchsorted(self.doc_starts, position, side="right") - 1
      ).astype(np.int32)
    return out


class RandomBlocks:
  """b random blocks of m consecutive segments per step, lane-major rows.

  The stream is cut into blocks of m * L tokens at multiples of m * L and
  visited as :class:`RandomSegments` visits segments (an order drawn from
  ``(seed, epoch)``, b blocks per step); each block is returned as m
  consecutive rows of L tokens, so a step holds b "documents" of m
  consecutive segments (TRIME paper, Sec. 4.2, Figure 2(b)) and the rows of
  one block share a 'lane_id'. Unlike :class:`ConsecutiveSegments`, the
  blocks of successive steps are unrelated, so the batches are as
  independent across steps as :class:`RandomSegments`'s.
  """

  def __init__(
      self,
      tokens: np.ndarray,
      seq_len: int,
      blocks: int,
      segments_per_block: int,
      seed: int,
  ):
    """Creates the sampler.

    Args:
        tokens: [N] int token stream.
        seq_len: segment length L.
        blocks: blocks (lanes) per step, b.
        segments_per_block: consecutive segments per block, m.
        seed: non-negative random seed.

    Raises:
        ValueError: the stream is shorter than m * L + 1 tokens.
    """
    _check_positive(
        seq_len=seq_len, blocks=blocks, segments_per_block=segments_per_block
    )
    self.seq_len = seq_len
    self.blocks = blocks
    self.segments_per_block = segments_per_block
    self._blocks = RandomSegments(
        tokens, seq_len * segments_per_block, blocks, seed=seed
    )

  @property
  def rows(self) -> int:
    """Rows per batch: blocks * segments_per_block."""
    return self.blocks * self.segments_per_block

  @property
  def steps_per_epoch(self) -> int:
    return self._blocks.steps_per_epoch

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """Returns the batch of ``step``.

    Returns:
        'inputs', 'targets': [b * m, L] int32, lane-major.
        'position': [b * m, L] int64 stream offsets of the inputs.
        'lane_id': [b * m] int32 block of each row.
    """
    block = self._blocks.batch(step)
    shape = (self.rows, self.seq_len)
    return {
        "inputs": block["inputs"].reshape(shape),
        "targets": block["targets"].reshape(shape),
        "position": block["position"].reshape(shape),
        "lane_id": np.repeat(
            np.arange(self.blocks, dtype=np.int32), self.segments_per_block
        ),
    }


class PackedSegments:
  """Aligned segments served in a given order, B per step (BM25 packing).

  Segment i covers predictions [i * L, (i + 1) * L) of the stream (inputs
  tokens[i*L : i*L + L], targets one token later), as in
  :class:`RandomSegments` with ``aligned=True``. ``order`` (e.g. from
  ``memjax.methods.trime.bm25_order.cached_bm25_order``) lists segment indices; indices of
  segments without L + 1 tokens are dropped, the rest is cut into batches
  of B consecutive entries (a short last batch is dropped), so batch j of
  the packing holds order[j*B : (j+1)*B]. Every epoch serves each batch
  once, the batches in an order drawn from ``(seed, epoch)``; the rows of
  a batch are never separated. ``batch(step)`` depends only on (tokens,
  settings, order, seed, step).
  """

  def __init__(
      self,
      tokens: np.ndarray,
      seq_len: int,
      batch_size: int,
      order: np.ndarray,
      seed: int,
  ):
    """Creates the sampler.

    Args:
        tokens: [N] int token stream.
        seq_len: segment length L.
        batch_size: rows per step B.
        order: [S] int segment indices in packing order.
        seed: non-negative random seed for the order of the batches.

    Raises:
        ValueError: fewer than B usable segments in ``order``.
    """
    _check_positive(seq_len=seq_len, batch_size=batch_size)
    self._tokens = _as_stream(tokens)
    self.seq_len = seq_len
    self.batch_size = batch_size
    self.seed = seed
    order = np.asarray(order, np.int64).reshape(-1)
    usable = (len(self._tokens) - 1) // seq_len
    order = order[(order >= 0) & (order < usable)]
    self.num_batches = len(order) // batch_size
    if self.num_batches < 1:
      raise errors.ConfigError(
          f"The packing order holds {len(order)} usable segments of "
          f"{seq_len} tokens, fewer than one batch of {batch_size}."
      )
    self.batches = order[: self.num_batches * batch_size].reshape(
        self.num_batches, batch_size
    )
    self._perm_cache: dict[int, np.ndarray] = {}

  @property
  def steps_per_epoch(self) -> int:
    return self.num_batches

  def epoch_order(self, epoch: int) -> np.ndarray:
    """[num_batches] int64: order of the packed batches in ``epoch``."""
    if epoch not in self._perm_cache:
      if len(self._perm_cache) >= 2:
        self._perm_cache.pop(min(self._perm_cache))
      rng = np.random.default_rng([self.seed, epoch])
      self._perm_cache[epoch] = rng.permutation(self.num_batches)
    return self._perm_cache[epoch]

  def segments(self, step: int) -> np.ndarray:
    """[B] int64 segment indices of ``step``."""
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}.")
    epoch, k = divmod(step, self.num_batches)
    return self.batches[self.epoch_order(epoch)[k]]

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """Returns 'inputs', 'targets' [B, L] int32, 'position' [B, L] int64."""
    position = self.segments(step)[:, None] * self.seq_len + np.arange(
        self.seq_len
    )
    return {
        "inputs": self._tokens[position].astype(np.int32),
        "targets": self._tokens[position + 1].astype(np.int32),
        "position": position,
    }
