"""``--mode=position_loss`` on hand-made streams: documents and sections,
windows that never cross a document, positions, bucket means, and scores
of a document's first tokens independent of the document before it."""

import types

import jax
import numpy as np

from memjax.models import transformer
from memjax.modes import position_loss as pl

EQ, EOS = 7, 1


def test_sections_and_spans():
  # doc 0: "a <eos> = = h = = <eos> b c"; doc 1 starts at 10.
  toks = np.array([5, EOS, EQ, EQ, 9, EQ, EQ, EOS, 3, 4, 6, 6, 6, 6])
  starts = pl.section_starts(toks, EQ, EOS)
  np.testing.assert_array_equal(starts, [2])
  spans = pl.document_spans(len(toks), np.array([0, 10]), starts)
  np.testing.assert_array_equal(spans, [[0, 2], [2, 10], [10, 14]])


def test_windows_positions_and_buckets():
  toks = np.arange(30, dtype=np.int32)
  spans = np.array([[0, 12], [12, 30]])
  b = pl.position_windows(toks, spans, window_len=6, score_len=3)
  scored = b["weights"] > 0
  pos = b["positions"][scored]
  # Every prediction of every document once: positions 1..11 and 1..17.
  np.testing.assert_array_equal(np.sort(pos), np.sort(np.r_[1:12, 1:18]))
  # Token ids are offsets: a window's inputs stay inside its document
  # (context reset) and the input of a prediction at position p is p - 1.
  for x, y, w, p in zip(b["inputs"], b["targets"], b["weights"],
                        b["positions"]):  # fmt: skip
    lo = 0 if x[0] < 12 else 12
    s = w > 0
    assert x[0] >= lo
    np.testing.assert_array_equal(x[s], lo + p[s] - 1)
    np.testing.assert_array_equal(y[s], x[s] + 1)
  nll = np.linspace(0, 1, pos.size)
  rows = pl.bucket_means(pos, nll, (1, 5, 10))
  assert [r["bucket"] for r in rows] == ["1-4", "5-9", "10+"]
  for r, (lo, hi) in zip(rows, [(1, 4), (5, 9), (10, 99)]):
    m = (pos >= lo) & (pos <= hi)
    assert r["tokens"] == m.sum()
    np.testing.assert_allclose(r["nll"], nll[m].mean())


def test_first_tokens_ignore_previous_document():
  model = transformer.TransformerLM(
      vocab_size=20, num_layers=1, d_model=16, num_heads=2, head_dim=8,
      d_ff=32,
  )  # fmt: skip
  x = np.zeros((1, 8), np.int32)
  params = model.init(jax.random.key(0), x, x)["params"]
  mesh = jax.sharding.Mesh(
      np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor")
  )
  restored = types.SimpleNamespace(model=model, params=params, mesh=mesh)
  rng = np.random.default_rng(0)
  a = rng.integers(0, 20, 40).astype(np.int32)
  b = a.copy()
  b[:20] = rng.integers(0, 20, 20)  # another first document
  spans = np.array([[0, 20], [20, 40]])
  wa = pl.position_windows(a, spans, 8, 4)
  wb = pl.position_windows(b, spans, 8, 4)
  both = {k: np.concatenate([wa[k], wb[k]]) for k in wa}
  nll = pl.score_windows(restored, both, 8)
  half = len(wa["inputs"]) // 2  # the windows of the second document
  n = len(wa["inputs"])
  np.testing.assert_allclose(nll[half:n], nll[n + half :], rtol=1e-6)
  assert not np.allclose(nll[:half], nll[n : n + half])
