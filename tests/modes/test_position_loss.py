"""``--mode=position_loss`` on hand-made streams: documents and sections,
windows that never cross a document, positions, bucket means, scores of a
document's first tokens independent of the document before it, a recurrent
model's memory carried within each document, and the kNN-LM evaluation
memory inside the mode."""

import jax
import numpy as np

from memjax import build
from memjax import config as config_lib
from memjax import sharding as sharding_lib
from memjax.data import windows
from memjax.eval import external
from memjax.eval import grid as grid_lib
from memjax.eval import memory_grid as em_lib
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.memory import datastore as ds_lib
from memjax.memory import search
from memjax.models import transformer
from memjax.modes import position_loss as pl
from memjax.run import restore
from tests.models import helpers

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
  b = windows.document_windows(toks, spans, window_len=6, score_len=3)
  scored = b["weights"] > 0
  pos = b["positions"][scored]
  # Every prediction of every document once: positions 1..11 and 1..17.
  np.testing.assert_array_equal(np.sort(pos), np.sort(np.r_[1:12, 1:18]))
  # Token ids are offsets: a window's inputs stay inside its document
  # (context reset) and the input of a prediction at position p is p - 1.
  for x, y, w, p in zip(
      b["inputs"], b["targets"], b["weights"], b["positions"]
  ):
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
      cfg=helpers.config(
          20, num_layers=1, d_model=16, num_heads=2, head_dim=8, d_ff=32
      )
  )
  x = np.zeros((1, 8), np.int32)
  params = model.init(jax.random.key(0), x, x)["params"]
  mesh = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  rng = np.random.default_rng(0)
  a = rng.integers(0, 20, 40).astype(np.int32)
  b = a.copy()
  b[:20] = rng.integers(0, 20, 20)  # another first document
  spans = np.array([[0, 20], [20, 40]])
  wa = windows.document_windows(a, spans, 8, 4)
  wb = windows.document_windows(b, spans, 8, 4)
  both = {k: np.concatenate([wa[k], wb[k]]) for k in wa}
  scorer = rows.Scorer(rows.Scoring(model, mesh))
  out = scorer.rows(params, both, batch_size=8, keep=("target_logprob",))
  nll = -out["target_logprob"]
  half = len(wa["inputs"]) // 2  # the windows of the second document
  n = len(wa["inputs"])
  np.testing.assert_allclose(nll[half:n], nll[n + half :], rtol=1e-6)
  assert not np.allclose(nll[:half], nll[n : n + half])


def _config(**eval_settings):
  c = config_lib.base_config()
  c.eval.update(eval_settings)
  c.eval_memory.batch_size, c.eval_memory.block_size = 4, 4
  return c


def _restored(model, x, config=None, path=""):
  """``model`` freshly initialised as a restored run of ``config`` (default
  ``_config()``) at ``path``, on one device."""
  params = model.init(jax.random.key(0), x, x)["params"]
  run = build.build(config or _config(), path, mesh={"data": 1})
  return restore.Restored(
      run=run,
      model=model,
      params=params,
      step=0,
      vocab=None,
      vocab_size=model.cfg.vocab_size,
      unit="ppl",
      path=path,
      kind="run",
  )


def _memories():
  """The evaluation memories of a run."""
  return build.parts().eval_memories


def _stream(lengths, seed=0):
  rng = np.random.default_rng(seed)
  toks = rng.integers(3, 20, sum(lengths)).astype(np.int32)
  starts = np.cumsum([0] + list(lengths))
  return toks, np.stack([starts[:-1], starts[1:]], axis=1)


def test_carried_memory_equals_one_window_per_document():
  # Transformer-XL whose memory (16) covers a whole document: scoring a
  # document in segments of 4 with the memory carried equals scoring it in
  # one window from an empty memory; no document sees the one before it.
  model = transformer.TransformerLM(
      cfg=helpers.tiny(
          20,
          num_layers=2,
          mem_len=16,
          attention="xl",
      )
  )
  config = _config(segment_len=4, mem_len=16, batch_size=2)  # 2 lanes
  restored = _restored(model, np.zeros((1, 4), np.int32), config)
  scorer = pl.run_scorer(restored, "", "none")
  toks, spans = _stream([13, 17, 9])  # 3 documents: two lane groups
  pos, nll = pl.document_scores(scorer, restored.params, toks, spans)
  # The reference: every document alone in one window (padded to one
  # length; causal, so the padding changes nothing before it).
  x = np.zeros((len(spans), 16), np.int32)
  y = np.zeros((len(spans), 16), np.int32)
  for d, (a, b) in enumerate(spans):
    x[d, : b - a - 1], y[d, : b - a - 1] = toks[a : b - 1], toks[a + 1 : b]
  lp = model.apply(
      {"params": restored.params}, x, y, memory=model.init_memory(len(spans))
  ).target_logprob
  ref = [-np.asarray(lp)[d, : b - a - 1] for d, (a, b) in enumerate(spans)]
  np.testing.assert_array_equal(
      pos, np.concatenate([np.arange(1, b - a) for a, b in spans])
  )
  # Segments of 4 with the memory carried = the whole document at once.
  np.testing.assert_allclose(nll, np.concatenate(ref), rtol=1e-5, atol=1e-5)


def test_knn_memory_in_position_loss(tmp_path):
  # kNN-LM inside position_loss: at lambda 0 it is the model alone on the
  # same windows; at lambda 0.5 it differs, and a document's scores still
  # ignore the document before it (the datastore is fixed, the context is
  # reset).
  model = transformer.TransformerLM(
      cfg=helpers.tiny(
          20,
      )
  )
  config = _config(window_len=8, score_len=4, batch_size=4)
  restored = _restored(model, np.zeros((1, 8), np.int32), config)
  rng = np.random.default_rng(3)
  store = ds_lib.from_arrays(
      str(tmp_path),
      rng.normal(size=(40, 16)) * 2.0,
      np.arange(40) % 20,
      signature={"model": {"d_model": 16}},
      shard_size=20,
  )
  ext = external.ExternalSearch(search.ExactSearcher(store, "squared_l2"), 8)
  toks, spans = _stream([12, 15])
  params = restored.params
  alone = pl.document_scores(
      scorer_lib.scorer_for(restored.scoring()), params, toks, spans
  )

  def knn(lam, tokens):
    setting = {"kind": "knn", "knn_lambda": lam, "knn_temperature": 1.0}
    scorer = scorer_lib.scorer_for(restored.scoring(), setting, external=ext)
    return pl.document_scores(scorer, params, tokens, spans)

  at0 = knn(0.0, toks)
  np.testing.assert_array_equal(at0[0], alone[0])
  np.testing.assert_allclose(at0[1], alone[1], rtol=1e-5, atol=1e-5)
  half = knn(0.5, toks)
  assert not np.allclose(half[1], alone[1], atol=1e-3)
  other = toks.copy()
  other[:12] = rng.integers(3, 20, 12)  # another first document
  second = slice(11, None)  # the 14 predictions of the second document
  np.testing.assert_allclose(
      knn(0.5, other)[1][second], half[1][second], rtol=1e-6
  )


def test_config_memory_setting_keeps_external_settings(tmp_path):
  # memory='eval' reads the run's setting as memjax.load(...).score does; a
  # configured kNN-LM keeps its lambda and temperature.
  config = _config()
  config.eval_memory.kind = "knn"
  config.external.knn_lambda, config.external.knn_temperature = 0.4, 2.0
  model = transformer.TransformerLM(cfg=helpers.config(20))
  scoring = build.build(config, str(tmp_path)).scoring(model)
  setting = scorer_lib.memory_setting(scoring)
  grid = grid_lib.grid_of(setting, _memories())
  values = grid.values()
  assert (grid.kind, values["knn_lambdas"], values["knn_temperatures"]) == (
      "knn",
      (0.4,),
      (2.0,),
  )


def test_long_memory_compiled_once_for_all_documents():
  # TRIMELM_long's evaluation memory (trime, 16 long-term tokens), one
  # stream per document as position_loss reads it: the documents share one
  # compiled step, and the last document, scored after the others, equals
  # a fresh scorer alone on it with a step built afresh (no state leaks).
  model = transformer.TransformerLM(
      cfg=helpers.tiny(
          20,
      )
  )
  restored = _restored(model, np.zeros((1, 8), np.int32))
  toks, spans = _stream([13, 22, 19], seed=5)
  grid = grid_lib.grid_of({"kind": "trime", "long_mem_tokens": 16}, _memories())

  def scorer():
    return em_lib.MemoryScorer(
        rows.Scoring(model, restored.mesh),
        grid,
        window_len=8,
        score_len=4,
        batch_size=4,
        block_size=4,
    )

  shared_scorer = scorer()
  shared = shared_scorer.document_logprobs(restored.params, toks, spans)
  # pylint: disable-next=protected-access
  assert len(shared_scorer.compiled) == 1  # one step for the 3 documents
  assert [len(s) for s in shared] == [12, 21, 18]
  alone = scorer().stream_logprobs(restored.params, toks[spans[-1, 0] :])
  np.testing.assert_allclose(shared[-1], alone, rtol=1e-6, atol=1e-6)
