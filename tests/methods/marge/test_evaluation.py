"""What ``--mode=marge_eval`` shows of the first windows' retrieval, on a
hand-made table (the mode itself runs in colabs/marge.ipynb's test)."""

import types

import numpy as np

from memjax.methods.marge import evaluation


def test_examples_hand_case():
  # Training documents [0..5] and [6..8], evaluated ones [100..106] and
  # [107..112], N = 3: segments start at 0, 3, 6 | 9, 12, 16, 19 (pool 3).
  train = types.SimpleNamespace(
      tokens=np.arange(9, dtype=np.int32), doc_starts=np.array([0, 6])
  )
  tokens = np.arange(100, 113, dtype=np.int32)
  table, pool = evaluation.eval_table(train, tokens, np.array([0, 7]), 3)
  assert pool == 3
  emb = np.stack([np.arange(7.0), np.ones(7)], axis=1)  # e(j) = (j, 1)
  sources = np.array([[2, 0], [3, -1]])
  got = evaluation.examples(table, emb, np.array([3, 5]), sources, pool)
  assert got == [
      {
          "segment": [100, 101, 102],
          "next": [103, 104, 105],
          "sources": [
              # e(3).e(2) = 3 * 2 + 1; the second training document ends.
              dict(
                  similarity=7.0,
                  segment=[6, 7, 8],
                  continuation=[],
                  own_past=False,
              ),
              dict(
                  similarity=1.0,
                  segment=[0, 1, 2],
                  continuation=[3, 4, 5],
                  own_past=False,
              ),
          ],
      },
      {
          "segment": [107, 108, 109],
          "next": [110, 111, 112],
          "sources": [  # an evaluated document's segment: id >= pool
              dict(
                  similarity=16.0,
                  segment=[100, 101, 102],
                  continuation=[103, 104, 105],
                  own_past=True,
              ),
          ],
      },
  ]
