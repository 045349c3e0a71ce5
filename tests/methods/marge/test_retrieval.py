"""Causal retrieval for the modified-MARGE LM on hand-made corpora: the
segment table, the causal mask, exact and ScaNN top-k, the batch layout,
same-document warm-up batches, staleness and bad settings."""

import ml_collections
import numpy as np
import pytest

from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax.methods.marge import evaluation as marge_eval
from memjax.methods.marge import retrieval as marge
from memjax.methods.marge import reindex as marge_index
from tests.models import helpers

# Two documents of 10 and 7 tokens, N = 3: segments 0,1,2 (doc 0, t = 0..2)
# and 3,4 (doc 1, t = 0..1); the last token of each document is dropped.
TOKENS = np.arange(100, 117, dtype=np.int32)
DOCS = np.array([0, 10])


@pytest.fixture
def table():
  return marge.SegmentTable.build(TOKENS, DOCS, 3)


def test_segment_table(table):
  np.testing.assert_array_equal(table.start, [0, 3, 6, 10, 13])
  np.testing.assert_array_equal(table.doc, [0, 0, 0, 1, 1])
  np.testing.assert_array_equal(table.pos, [0, 1, 2, 0, 1])
  np.testing.assert_array_equal(table.next, [1, 2, -1, 4, -1])
  np.testing.assert_array_equal(table.targets, [0, 1, 3])
  assert table.longest_document == 3


def test_causal_mask_hand_case(table):
  cand = np.array([[0, 1, 2, 3, 4, -1]] * 3)
  allowed = table.allowed(np.array([1, 0, 3]), cand)
  np.testing.assert_array_equal(
      allowed,
      [
          [True, False, False, True, True, False],  # S_1: own S_0 only
          [False, False, False, True, True, False],  # S_0: no own past
          [True, True, True, False, False, False],  # doc 1, S_0
      ],
  )
  # The future scores highest; causal top-k skips it and pads with -1.
  scores = np.array([[0.5, 9.0, 8.0, 0.1, 0.3, 0.0]])
  got = marge.causal_topk(table, scores, cand[:1], np.array([1]), 4)
  np.testing.assert_array_equal(got, [[0, 4, 3, -1]])


@pytest.mark.parametrize("search", ["exact", "scann"])
def test_index_never_returns_own_future(table, search):
  # Each segment's nearest embedding is the next segment of its document.
  emb = np.eye(5, dtype=np.float32)
  emb[0, 1] = emb[1, 2] = emb[3, 4] = 0.9
  emb /= np.linalg.norm(emb, axis=1, keepdims=True)
  index = marge.SegmentIndex(table, emb, search)
  got = index.topk(np.array([0, 1, 3]), 2)
  for q, row in zip([0, 1, 3], got):
    for c in row[row >= 0]:
      assert not (table.doc[c] == table.doc[q] and table.pos[c] >= table.pos[q])
  np.testing.assert_array_equal(got[1, :1], [0])  # S_1's best: its own S_0


def test_window_arrays(table):
  out = marge.window_arrays(table, np.array([1]), np.array([[3, 4, -1]]))
  np.testing.assert_array_equal(out["inputs"][0], TOKENS[3:9])
  np.testing.assert_array_equal(out["targets"][0], TOKENS[4:10])
  np.testing.assert_array_equal(out["weights"][0], [0, 0, 1, 1, 1, 0])
  # Segment 3 + its continuation 4; segment 4 has none; slot 3 is empty.
  np.testing.assert_array_equal(out["sources"][0, 0], TOKENS[10:16])
  np.testing.assert_array_equal(out["source_mask"][0, 1], [1, 1, 1, 0, 0, 0])
  assert not out["source_mask"][0, 2].any()


def test_same_doc_batches_use_own_past(table):
  b = marge.MargeBatcher(table, 8, 2, same_doc_steps=5, sub_batch=4)
  out = b.batch(0)
  for row, ids in zip(out["inputs"], out["source_ids"]):
    q = int(np.searchsorted(table.start, row[0] - TOKENS[0]))  # S_t's id
    for c in ids[ids >= 0]:
      assert table.doc[c] == table.doc[q] and table.pos[c] < table.pos[q]
  assert (out["source_ids"][out["inputs"][:, 0] == TOKENS[0]] == -1).all()
  # Sub-batches of 4 windows share a document.
  docs = table.doc[
      np.searchsorted(table.start, out["inputs"][:, 0] - TOKENS[0])
  ]
  assert (docs.reshape(2, 4) == docs.reshape(2, 4)[:, :1]).all()


def test_staleness():
  old = np.array([[1, 2], [3, -1]])
  new = np.array([[2, 5], [3, -1]])
  assert marge_index.staleness(old, new) == pytest.approx(1 / 3)


def test_bad_settings():
  c = config_lib.base_config()
  c.model.family_options = ml_collections.ConfigDict(
      dict(segment_len=3, num_sources=2)
  )
  c.data.seq_len = 8
  train = type("S", (), dict(tokens=TOKENS, doc_starts=DOCS))

  def batcher():  # The batcher of the config's settings as they are now.
    return marge.marge_batcher(build.read(c, build.parts()), train, "")

  with pytest.raises(errors.ConfigError, match="seq_len 8 must be 2"):
    batcher()
  c.data.seq_len = 6
  c.model.family_options.num_sources = 9
  with pytest.raises(errors.ConfigError, match="num_sources 9 exceeds"):
    batcher()
  c.model.family_options.num_sources = 2
  c.model.max_len = 5  # 2N = 6 tokens do not fit
  with pytest.raises(errors.ConfigError, match="segment_len 3 must be"):
    batcher()
  with pytest.raises(errors.ConfigError, match="another corpus"):
    marge.SegmentIndex(
        marge.SegmentTable.build(TOKENS, DOCS, 3), np.ones((4, 2)), "exact"
    )


def test_index_of_another_embedder_refused(tmp_path, table):
  from memjax.run import hooks  # pylint: disable=g-import-not-at-top
  from memjax.methods.marge import model as marge_model  # pylint: disable=g-import-not-at-top

  path = tmp_path / "step_1.npy"
  np.save(path, np.ones((len(table), 8), np.float32))
  model = marge_model.MargeLM(cfg=helpers.config(9, d_model=8), segment_len=3)
  ctx = hooks.HookContext(
      name="marge_reindex",
      options={},
      settings=build.read(config_lib.base_config(), build.parts()),
      workdir=str(tmp_path),
      model=model,
      batcher=marge.MargeBatcher(table, 2, 2),
  )
  ok = marge_index.MargeReindex(ctx, {"index": str(path)})
  ok.state["embedder"] = ok._embedder()  # pylint: disable=protected-access
  ok.start()
  assert ctx.batcher.index is not None
  other = dict(ok.state["embedder"], pooling="last")
  hook = marge_index.MargeReindex(ctx, {"index": str(path), "embedder": other})
  with pytest.raises(errors.ConfigError, match="another embedder"):
    hook.start()


def _eval_case():
  """Training: two documents (6 and 3 tokens); evaluated: two documents
  (7 and 6 tokens); N = 3. Segments 0, 1 (train doc 0), 2 (train doc 1),
  then 3, 4 (evaluated doc A, t = 0, 1) and 5, 6 (evaluated doc B)."""
  import types  # pylint: disable=g-import-not-at-top

  train = types.SimpleNamespace(
      tokens=np.arange(9, dtype=np.int32), doc_starts=np.array([0, 6])
  )
  tokens = np.arange(100, 113, dtype=np.int32)
  return marge_eval.eval_table(train, tokens, np.array([0, 7]), 3)


def test_eval_table_pool_is_the_training_segments():
  table, pool = _eval_case()
  np.testing.assert_array_equal(table.start, [0, 3, 6, 9, 12, 16, 19])
  np.testing.assert_array_equal(table.doc, [0, 0, 1, 2, 2, 3, 3])
  assert pool == 3  # the first evaluated segment starts at token 9 exactly


def test_eval_mask_with_a_pool_hand_case():
  table, pool = _eval_case()
  cand = np.array([[2, 3, 4, 5, 6, -1]] * 3)
  got = table.allowed(np.array([4, 6, 3]), cand, pool)
  np.testing.assert_array_equal(
      got,
      [
          # A's S_1: the last training segment (pool - 1) and its own S_0,
          # which is the first evaluated segment (id == pool).
          [True, True, False, False, False, False],
          # B's S_1: never A's segments (3 is exactly at the pool), its
          # own S_0 (5) only.
          [True, False, False, True, False, False],
          # A's S_0: no past of its own; B is another evaluated document.
          [True, False, False, False, False, False],
      ],
  )
  # Without a pool (training) another document's segments are all allowed.
  assert table.allowed(np.array([6]), cand[:1])[0].tolist() == [
      True,
      True,
      True,
      True,
      False,
      False,
  ]
  # Causal top-k with the pool skips the other evaluated document even
  # where it scores highest.
  scores = np.array([[0.1, 9.0, 8.0, 0.5, 7.0, 0.0]])
  np.testing.assert_array_equal(
      marge.causal_topk(table, scores, cand[:1], np.array([6]), 3, pool),
      [[5, 2, -1]],
  )
