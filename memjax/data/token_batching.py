"""Batches of sentence pairs by token count, in length buckets ('tokens').

Each pair goes to the smallest bucket length that holds both its source and
its target (pairs longer than the last bucket are left out of training, and
counted). A bucket of length L makes batches of ``rows(L)`` pairs, about
``translation.max_tokens / L`` rounded down to a multiple of ``row_multiple``
(the data-parallel devices), so every batch has about the same number of
tokens (Table 9: 16,384 per update) and there is one compiled step per
bucket. ``batch(step)`` is a pure function of the step: epoch e is a
permutation of the pairs within each bucket and of the batches, seeded by
(seed, e).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from memjax import errors

# Decoder inputs start with the pad id (SeqIO's encoder-decoder convention).
DECODER_START = 0


def pad_rows(seqs: Sequence[np.ndarray], length: int) -> np.ndarray:
  """[N, length] int32, each sequence left-aligned and padded with 0."""
  out = np.zeros((len(seqs), length), np.int32)
  for i, s in enumerate(seqs):
    out[i, : len(s)] = s[:length]
  return out


def make_pair_batch(
    source: Sequence[np.ndarray],
    target: Sequence[np.ndarray],
    src_len: int,
    tgt_len: int,
) -> dict[str, np.ndarray]:
  """Arrays of a batch of pairs (ids ending in EOS).

  Returns:
    'source' [N, src_len], 'inputs' [N, tgt_len] (decoder inputs: the
    start id, then the target shifted right), 'targets' [N, tgt_len],
    'weights' [N, tgt_len] float32 (1 on target tokens, 0 on padding).
  """
  tgt = pad_rows(target, tgt_len)
  inputs = np.full_like(tgt, DECODER_START)
  inputs[:, 1:] = tgt[:, :-1]
  return {
      "source": pad_rows(source, src_len),
      "inputs": inputs,
      "targets": tgt,
      "weights": (tgt != 0).astype(np.float32),
  }


class TokenBatcher:
  """Length-bucketed batches of about ``max_tokens`` tokens.

  Attributes:
    buckets: the bucket lengths, increasing.
    rows: pairs per batch of each bucket.
    num_batches: batches per epoch.
    dropped: training pairs longer than the last bucket.
  """

  def __init__(
      self,
      source: Sequence[np.ndarray],
      target: Sequence[np.ndarray],
      *,
      max_tokens: int,
      buckets: Sequence[int],
      seed: int,
      row_multiple: int = 1,
  ):
    self.source, self.target = list(source), list(target)
    self.buckets = tuple(sorted(int(b) for b in buckets))
    self.seed = int(seed)
    self.rows = {}
    for b in self.buckets:
      rows = (max_tokens // b) // row_multiple * row_multiple
      if rows < 1:
        raise errors.ConfigError(
            f"translation.max_tokens {max_tokens} holds no batch of "
            f"{row_multiple} rows of bucket length {b}: raise it"
        )
      self.rows[b] = rows
    longest = np.maximum(
        [len(s) for s in self.source], [len(t) for t in self.target]
    )
    which = np.searchsorted(np.asarray(self.buckets), longest)
    self.dropped = int(np.sum(which >= len(self.buckets)))
    self.members = [
        np.flatnonzero(which == i) for i in range(len(self.buckets))
    ]
    self.num_batches = sum(
        -(-len(m) // self.rows[b]) for m, b in zip(self.members, self.buckets)
    )
    if self.num_batches == 0:
      raise errors.DataError(
          "no training pair fits translation.buckets "
          f"{self.buckets}: raise the last bucket"
      )
    self._plan_epoch = -1
    self._plan: list[tuple[int, np.ndarray]] = []

  def _epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    if epoch != self._plan_epoch:
      rng = np.random.default_rng([self.seed, epoch])
      plan = []
      for m, b in zip(self.members, self.buckets):
        m = rng.permutation(m)
        r = self.rows[b]
        plan += [(b, m[i : i + r]) for i in range(0, len(m), r)]
      self._plan = [plan[i] for i in rng.permutation(len(plan))]
      self._plan_epoch = epoch
    return self._plan

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """The batch of update ``step`` (see ``make_pair_batch``); a bucket's
    last batch of an epoch is filled with empty rows (weight 0)."""
    b, idx = self._epoch_plan(step // self.num_batches)[step % self.num_batches]
    src = [self.source[i] for i in idx]
    tgt = [self.target[i] for i in idx]
    empty = np.zeros((0,), np.int32)
    fill = self.rows[b] - len(idx)
    return make_pair_batch(src + [empty] * fill, tgt + [empty] * fill, b, b)
