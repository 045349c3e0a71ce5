"""Tests of BM25 packing (TRIME Algorithm 1)."""

import bm25s
import numpy as np
import pytest

from memjax.methods.trime import bm25
from memjax.methods.trime import bm25_order


def zipf_segments(num, length, vocab, seed=0):
  rng = np.random.default_rng(seed)
  p = 1.0 / np.arange(1, vocab + 1)
  return rng.choice(vocab, size=(num, length), p=p / p.sum()).astype(np.int32)


def topic_segments(
    num_topics=4,
    per_topic=8,
    length=40,
    words_per_topic=30,
    shared_words=10,
    seed=0,
):
  """Segments whose words come from their topic's own word set plus a few shared ones."""
  rng = np.random.default_rng(seed)
  segs, topics = [], []
  for t in range(num_topics):
    own = 1000 + t * 100 + np.arange(words_per_topic)
    for _ in range(per_topic):
      words = rng.choice(own, size=length)
      if shared_words:
        common = rng.random(length) < 0.3
        words[common] = rng.integers(0, shared_words, size=common.sum())
      segs.append(words)
      topics.append(t)
  perm = rng.permutation(len(segs))  # scatter the topics over the corpus
  return np.stack(segs)[perm].astype(np.int32), np.array(topics)[perm]


def check_algorithm_1(order, neighbours, seed):
  """Checks an order step by step against Algorithm 1 and the seeded starts."""
  num = len(order)
  assert sorted(order.tolist()) == list(range(num))
  perm = np.random.default_rng(seed).permutation(num).tolist()
  used = set()
  restarts = 0
  for i, c in enumerate(order.tolist()):
    prev_hits = (
        []
        if i == 0
        else [n for n in neighbours[order[i - 1]] if n >= 0 and n not in used]
    )
    if prev_hits:
      assert c == prev_hits[0], f"step {i}: expected the best unused hit"
    else:
      restarts += 1
      assert c == next(
          x for x in perm if x not in used
      ), f"step {i}: expected a random start"
    used.add(c)
  return restarts


def test_neighbours_match_bm25s_retrieve():
  segs = zipf_segments(120, 30, 400, seed=1)
  k = 8
  # Independent path: bm25s over string tokens, one query at a time.
  corpus = [[f"w{t}" for t in s] for s in segs]
  retriever = bm25s.BM25()
  retriever.index(corpus, show_progress=False)
  docs, scores = retriever.retrieve(
      corpus, k=k + 1, show_progress=False, backend_selection="numpy"
  )
  for dense_terms in (None, 0, 7):
    got = bm25.bm25_neighbours(
        segs, k, dense_terms=dense_terms, show_progress=False
    )
    assert got.shape == (len(segs), k)
    for i in range(len(segs)):
      ours = retriever.get_scores(corpus[i])[got[i]]
      # Same scores in the same (descending) order as bm25s's top-k.
      np.testing.assert_allclose(ours, scores[i, :k], rtol=1e-5, atol=1e-5)
      # Same hits wherever the k-th score is not tied with the next one.
      if scores[i, k - 1] - scores[i, k] > 1e-3:
        assert set(got[i].tolist()) == set(docs[i, :k].tolist())
    assert np.all(
        got[:, 0] == np.arange(len(segs))
    )  # each segment is its own best hit


def test_segments_sharing_no_term_are_not_hits():
  segs = np.array([[1, 2, 3], [1, 2, 4], [7, 8, 9], [7, 8, 8]])
  got = bm25.bm25_neighbours(segs, 3, show_progress=False)
  assert set(got[0, :2].tolist()) == {0, 1} and got[0, 2] == -1
  assert set(got[2, :2].tolist()) == {2, 3} and got[2, 2] == -1


@pytest.mark.parametrize(
    "num,batch_size,k", [(1, 4, 20), (37, 5, 3), (100, 16, 20)]
)
def test_order_covers_every_segment_exactly_once(num, batch_size, k):
  segs = zipf_segments(num, 20, 200, seed=num)
  order = bm25.bm25_pack(segs, batch_size, k=k, seed=3, show_progress=False)
  assert order.dtype == np.int64
  np.testing.assert_array_equal(np.sort(order), np.arange(num))


def test_order_follows_algorithm_1():
  segs = zipf_segments(60, 15, 150, seed=4)
  neighbours = bm25.bm25_neighbours(segs, 4, show_progress=False)
  for seed in (0, 1):
    order, restarts = bm25.pack_from_neighbours(neighbours, seed)
    assert check_algorithm_1(order, neighbours, seed) == restarts
    np.testing.assert_array_equal(
        order, bm25.bm25_pack(segs, 6, k=4, seed=seed, show_progress=False)
    )


def test_pack_from_neighbours_on_a_hand_made_table():
  # Chains 0 -> 3 -> 1 -> 2, then 2's hits are used up; 4 comes from a restart.
  neighbours = np.array(
      [[0, 3, 1], [1, 2, 0], [2, 0, 1], [3, 1, -1], [4, -1, -1]]
  )
  start = next(
      s for s in range(100) if np.random.default_rng(s).permutation(5)[0] == 0
  )
  order, restarts = bm25.pack_from_neighbours(neighbours, start)
  np.testing.assert_array_equal(order, [0, 3, 1, 2, 4])
  assert restarts == 2


@pytest.mark.parametrize("shared_words", [0, 10])
def test_lexically_similar_segments_share_a_batch(shared_words):
  # shared_words=0: disjoint vocabularies, other topics are never hits; else
  # every segment also has ~30% common words, so other topics score too.
  segs, topics = topic_segments(shared_words=shared_words)
  order = bm25.bm25_pack(segs, batch_size=8, k=20, seed=0, show_progress=False)
  batches = topics[order].reshape(-1, 8)
  for batch in batches:
    assert len(set(batch.tolist())) == 1, batches
  # A random order would almost never do this.
  rng = np.random.default_rng(0)
  random_batches = topics[rng.permutation(len(topics))].reshape(-1, 8)
  assert any(len(set(b.tolist())) > 1 for b in random_batches)


def test_deterministic_given_seed():
  segs = zipf_segments(80, 10, 100, seed=5)
  a = bm25.bm25_pack(segs, 8, k=2, seed=11, show_progress=False)
  b = bm25.bm25_pack(segs, 8, k=2, seed=11, show_progress=False)
  c = bm25.bm25_pack(segs, 8, k=2, seed=12, show_progress=False)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_ragged_segments_and_stopwords():
  tokens = zipf_segments(1, 1003, 60, seed=6)[0]
  segs = bm25.split_segments(tokens, 100)
  assert len(segs) == 11 and len(segs[-1]) == 3
  np.testing.assert_array_equal(np.concatenate(segs), tokens)
  order = bm25.bm25_pack(
      segs, 4, k=5, show_progress=False, stopword_ids=[0, 1, 2]
  )
  np.testing.assert_array_equal(np.sort(order), np.arange(11))
  # Removing stop words changes the index: stop-word-only overlap is no hit.
  segs = [
      np.array([0, 0, 1, 5]),
      np.array([0, 1, 6, 7]),
      np.array([5, 9, 9, 1]),
  ]
  with_stop = bm25.bm25_neighbours(segs, 3, show_progress=False)
  without = bm25.bm25_neighbours(
      segs, 3, show_progress=False, stopword_ids=[0, 1]
  )
  assert (with_stop[0] >= 0).sum() == 3
  assert set(without[0][without[0] >= 0].tolist()) == {0, 2}


def test_cached_order(tmp_path, monkeypatch):
  tokens = zipf_segments(1, 3000, 200, seed=7)[0]
  first = bm25_order.cached_bm25_order(
      tokens, 50, 4, k=5, seed=1, cache_dir=tmp_path, show_progress=False
  )
  assert len(list(tmp_path.glob("bm25_order_*.npy"))) == 1
  np.testing.assert_array_equal(
      first,
      bm25.bm25_pack(
          bm25.split_segments(tokens, 50), 4, k=5, seed=1, show_progress=False
      ),
  )

  def fail(*args, **kwargs):
    raise AssertionError("recomputed despite the cache")

  # bm25_order binds bm25_pack by name: replace both.
  monkeypatch.setattr(bm25, "bm25_pack", fail)
  monkeypatch.setattr(bm25_order, "bm25_pack", fail)
  again = bm25_order.cached_bm25_order(
      tokens, 50, 8, k=5, seed=1, cache_dir=tmp_path, show_progress=False
  )  # batch size does not matter
  np.testing.assert_array_equal(first, again)
  monkeypatch.undo()
  other = bm25_order.cached_bm25_order(
      tokens, 50, 4, k=5, seed=2, cache_dir=tmp_path, show_progress=False
  )
  assert len(list(tmp_path.glob("bm25_order_*.npy"))) == 2
  np.testing.assert_array_equal(np.sort(other), np.arange(60))


def test_command_line(tmp_path):
  segs = zipf_segments(40, 12, 100, seed=8)
  np.savez(tmp_path / "segments.npz", segments=segs)
  out = tmp_path / "out" / "order.npy"
  bm25_order.main(
      [
          f"--segments_npz={tmp_path / 'segments.npz'}",
          "--batch_size=8",
          "--k=5",
          "--seed=3",
          f"--out={out}",
          "--no_progress",
      ]
  )
  np.testing.assert_array_equal(
      np.load(out), bm25.bm25_pack(segs, 8, k=5, seed=3, show_progress=False)
  )
  with pytest.raises(SystemExit):
    bm25_order.main(
        [
            f"--segments_npz={tmp_path / 'missing.npz'}",
            "--batch_size=8",
            f"--out={out}",
        ]
    )


def test_sharded_search_and_merge(tmp_path):
  segs = zipf_segments(50, 12, 100, seed=9)
  full = bm25.bm25_neighbours(segs, 4, show_progress=False)
  parts = [
      bm25.bm25_neighbours(segs, 4, show_progress=False, shard=(i, 3))
      for i in range(3)
  ]
  np.testing.assert_array_equal(np.concatenate(parts), full)
  np.savez(tmp_path / "segments.npz", segments=segs)
  paths = []
  for i in range(3):
    paths.append(str(tmp_path / f"neighbours_{i}.npy"))
    bm25_order.main(
        [
            f"--segments_npz={tmp_path / 'segments.npz'}",
            "--k=4",
            "--num_shards=3",
            f"--shard_id={i}",
            f"--out={paths[-1]}",
            "--no_progress",
        ]
    )
  bm25_order.main(
      [
          f"--neighbours={','.join(paths)}",
          "--seed=5",
          f"--out={tmp_path / 'order.npy'}",
      ]
  )
  np.testing.assert_array_equal(
      np.load(tmp_path / "order.npy"),
      bm25.bm25_pack(segs, 8, k=4, seed=5, show_progress=False),
  )


def test_top_k_rows_with_ties_and_zeros():
  rng = np.random.default_rng(10)
  for _ in range(20):
    rows, cols, k = (
        int(rng.integers(1, 8)),
        int(rng.integers(1, 3000)),
        int(rng.integers(1, 25)),
    )
    scores = rng.integers(0, 50, size=(rows, cols)).astype(np.float32) * 0.5
    got = bm25._top_k_rows(scores, k)
    for i in range(rows):
      best = np.lexsort((np.arange(cols), -scores[i]))  # score desc, index asc
      best = best[scores[i][best] > 0][:k]
      want = np.full(k, -1)
      want[: len(best)] = best
      np.testing.assert_array_equal(got[i], want)
