"""memjax.memory.search: recall of a search that returns fewer than k."""

import numpy as np
import pytest

from memjax.memory import search


def test_recall_counts_the_true_neighbours_a_short_answer_missed():
  # By hand: the first query's search found 2 of its 4 true neighbours and
  # padded the rest with -1 (recall 1/2, not 2 of the 2 it returned); the
  # second found all 4. A true list shorter than k (a datastore of fewer
  # keys than k) counts only its valid entries.
  exact = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [8, -1, -1, -1]])
  approx = np.array([[2, 0, -1, -1], [7, 6, 5, 4], [8, -1, -1, -1]])
  assert search.recall_at_k(approx, exact) == pytest.approx((0.5 + 1 + 1) / 3)
  assert search.recall_at_k(approx[:1], exact[:1]) == 0.5


def test_recall_of_a_search_over_part_of_the_keys():
  """Searches that pad with -1: the exact top-5 of 3 keys (3 valid), and a
  search that saw only two of them (2 valid): recall 2/3."""
  rng = np.random.default_rng(0)
  keys = rng.normal(size=(3, 4)).astype(np.float32)
  queries = rng.normal(size=(2, 4)).astype(np.float32)
  _, exact = search.exact_topk(queries, keys, 5, "dot_product")
  _, partial = search.exact_topk(queries, keys[:2], 5, "dot_product")
  assert ((exact >= 0).sum(1) == 3).all() and ((partial >= 0).sum(1) == 2).all()
  assert search.recall_at_k(partial, exact) == pytest.approx(2 / 3)
  assert search.recall_at_k(exact, exact) == 1.0
