"""Evaluation windows that begin with BOS inside a document, worked by hand."""

import numpy as np

from memjax.data import windows

BOS = 1
# Two documents, each led by BOS: [0, 9) and [9, 14).
TOKENS = np.array([1, 10, 11, 12, 13, 14, 15, 16, 17, 1, 20, 21, 22, 23])


def test_eval_windows_inside_a_document_begin_with_bos():
  (batch,) = windows.eval_batches(TOKENS, 6, 3, 4, bos=BOS)
  plain = next(windows.eval_batches(TOKENS, 6, 3, 4))
  np.testing.assert_array_equal(
      batch["inputs"],
      [
          [1, 10, 11, 12, 13, 14],  # the stream's start: as it is
          [1, 13, 14, 15, 16, 17],  # 12 replaced: context only
          [1, 16, 17, 1, 20, 21],  # 15 replaced
          [1, 20, 21, 22, 0, 0],  # starts at a BOS: as it is
      ],
  )
  # Targets, weights and positions are those of the windows without BOS.
  for k in ("targets", "weights", "position"):
    np.testing.assert_array_equal(batch[k], plain[k])
  np.testing.assert_array_equal(plain["inputs"][1], [12, 13, 14, 15, 16, 17])


def test_without_bos_or_without_context_windows_are_unchanged():
  plain = next(windows.eval_batches(TOKENS, 6, 3, 4))
  assert plain["inputs"][2, 0] == 15
  # Disjoint blocks score their first offset: nothing is replaced.
  blocks = next(windows.eval_batches(TOKENS, 4, 4, 4, bos=BOS))
  np.testing.assert_array_equal(blocks["inputs"][1], [13, 14, 15, 16])


def test_memory_windows_begin_with_bos_but_the_first_windows_copies():
  (batch,) = windows.memory_eval_batches(TOKENS, 6, 3, 8, bos=BOS)
  np.testing.assert_array_equal(batch["start"][:5], [0, 0, 3, 6, 9])
  np.testing.assert_array_equal(batch["inputs"][:, 0], [1, 1, 1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(batch["inputs"][2], [1, 13, 14, 15, 16, 17])
  # A stream that starts inside a document: its first window's copies read
  # it as it is (their scores are the first window's).
  (cut,) = windows.memory_eval_batches(TOKENS[2:], 6, 3, 8, bos=BOS)
  np.testing.assert_array_equal(cut["inputs"][:2, 0], [11, 11])
  assert cut["inputs"][2, 0] == BOS


def test_document_windows_begin_with_bos_after_each_documents_first():
  spans = np.array([[0, 9], [9, 14]])
  out = windows.document_windows(TOKENS, spans, 4, 2, bos=BOS)
  np.testing.assert_array_equal(
      out["inputs"],
      [[1, 10, 11, 12], [1, 12, 13, 14], [1, 14, 15, 16], [1, 20, 21, 22]],
  )
  plain = windows.document_windows(TOKENS, spans, 4, 2)
  np.testing.assert_array_equal(plain["inputs"][1], [11, 12, 13, 14])
  np.testing.assert_array_equal(out["targets"], plain["targets"])
