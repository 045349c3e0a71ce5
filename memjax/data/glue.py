"""GLUE-style sentence classification data ('sentences' batcher).

A split is ``<data_dir>/<split>.tsv`` in SST-2's format: a header line with
the columns ``sentence`` and ``label`` (tab-separated), then one example per
line. ``read_tsv`` refuses a file without that header, a line without both
columns, an empty sentence or a label outside ``classification.labels``,
naming the file and line. A sentence is encoded as ``[CLS]`` + its pieces
(cut at ``classification.max_len``) and padded to the smallest of
``classification.buckets`` that holds the longest sentence of its batch.

``SentenceBatcher.batch(step)`` is a pure function of the step: epoch e is
a permutation of the training examples seeded by (seed, e); the last batch
of an epoch is filled with empty rows of weight 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from memjax import errors
from memjax.io import paths
from memjax.data import sources

DEFAULT_DIR = paths.join(sources.DEMO_DATA_DIR, "sentiment")


@dataclasses.dataclass
class Examples:
  """A split's sentences, their ids ([CLS] first) and label indices."""

  text: list[str]
  ids: list[np.ndarray]
  labels: np.ndarray


def split_path(data_dir: str, split: str) -> str:
  path = paths.join(data_dir, f"{split}.tsv")
  if not paths.isfile(path):
    raise errors.DataError(
        f"missing classification file {path}: classification.data_dir needs "
        f"{split}.tsv (header 'sentence<TAB>label')"
    )
  return path


def read_tsv(path: str, labels: Sequence[str]) -> tuple[list[str], np.ndarray]:
  """(sentences, [N] int32 label indices into ``labels``) of a TSV file.

  Raises:
    errors.DataError: no 'sentence' and 'label' header, a short line, an
      empty sentence, or a label outside ``labels`` (one line naming the
      file and line number).
  """
  try:
    with paths.open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except UnicodeDecodeError as e:
    raise errors.DataError(f"{path} is not UTF-8 text ({e.reason})") from None
  header = lines[0].split("\t") if lines else []
  if "sentence" not in header or "label" not in header:
    raise errors.DataError(
        f"{path} line 1 must be the header 'sentence<TAB>label' (GLUE "
        f"format), got {lines[0][:60] if lines else 'an empty file'!r}"
    )
  si, li = header.index("sentence"), header.index("label")
  index = {str(l): i for i, l in enumerate(labels)}
  text, out = [], []
  for n, line in enumerate(lines[1:], start=2):
    cols = line.split("\t")
    if len(cols) <= max(si, li):
      raise errors.DataError(
          f"{path} line {n} has {len(cols)} tab-separated columns; the "
          f"header names {len(header)}"
      )
    sentence, label = cols[si].strip(), cols[li].strip()
    if not sentence:
      raise errors.DataError(f"{path} line {n} has an empty sentence")
    if label not in index:
      raise errors.DataError(
          f"{path} line {n} has label {label!r}, not one of "
          f"classification.labels {tuple(labels)}"
      )
    text.append(sentence)
    out.append(index[label])
  if not text:
    raise errors.DataError(f"{path} has a header but no example")
  return text, np.asarray(out, np.int32)


def encode_examples(
    text: list[str], labels: np.ndarray, vocab: Any, cls_id: int, max_len: int
) -> Examples:
  """[CLS] + the pieces of each sentence, cut to ``max_len`` ids."""
  pieces = vocab.tokenizer.encode(text)
  ids = [
      np.asarray([cls_id] + list(p)[: max_len - 1], np.int32) for p in pieces
  ]
  return Examples(text, ids, labels)


def pad_batch(
    ids: Sequence[np.ndarray], labels: np.ndarray, buckets: Sequence[int]
) -> dict[str, np.ndarray]:
  """'inputs' [N, L] (L the smallest bucket holding the longest row, 0 =
  padding), 'targets' [N, 1] labels, 'weights' [N, 1] (0 for empty rows)."""
  longest = max([len(x) for x in ids] + [1])
  length = next((b for b in sorted(buckets) if b >= longest), longest)
  inputs = np.zeros((len(ids), length), np.int32)
  for i, x in enumerate(ids):
    inputs[i, : len(x)] = x
  return {
      "inputs": inputs,
      "targets": np.asarray(labels, np.int32).reshape(-1, 1),
      "weights": np.asarray(
          [[1.0 if len(x) else 0.0] for x in ids], np.float32
      ),
  }


class SentenceBatcher:
  """Shuffled epochs of labelled sentences (see the module doc)."""

  def __init__(
      self,
      examples: Examples,
      *,
      batch_size: int,
      buckets: Sequence[int],
      seed: int,
  ):
    self.examples, self.batch_size = examples, int(batch_size)
    self.buckets, self.seed = tuple(buckets), int(seed)
    self.num_batches = -(-len(examples.ids) // self.batch_size)
    self._epoch, self._order = -1, np.zeros((0,), np.int64)

  def batch(self, step: int) -> dict[str, np.ndarray]:
    epoch, i = divmod(step, self.num_batches)
    if epoch != self._epoch:
      rng = np.random.default_rng([self.seed, epoch])
      self._epoch, self._order = epoch, rng.permutation(len(self.examples.ids))
    idx = self._order[i * self.batch_size : (i + 1) * self.batch_size]
    ids = [self.examples.ids[j] for j in idx]
    labels = list(self.examples.labels[idx])
    fill = self.batch_size - len(idx)
    ids += [np.zeros((0,), np.int32)] * fill
    labels += [0] * fill
    return pad_batch(ids, np.asarray(labels), self.buckets)
