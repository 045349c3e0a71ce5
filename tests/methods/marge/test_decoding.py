"""MARGE's key/value-cache decoding (methods/marge/decoding.py): its host
retrieval on a hand-made index, and on the shared smoke run each step
against ``--mode=marge_eval``'s retrieval and scoring of the same text."""

import numpy as np
import pytest

import memjax
from memjax import errors
from memjax.data import corpus as corpus_lib
from memjax.methods.marge import decoding
from memjax.methods.marge import evaluation
from memjax.methods.marge import reindex
from memjax.methods.marge import retrieval
from memjax.models import lm_decoding
from memjax.models import sampling as sampling_lib
from memjax.models import variables as model_vars


def test_the_host_ranks_training_segments_and_the_own_past_together():
  # Training documents [0..5] and [6..8], N = 3: segments 0, 1 | 2 (the
  # last has no continuation). e(j) = (j + 1, 0); own past e = (2.5, 0)
  # for S_0 and (9, 0) for S_1, which is not yet past (count 1).
  table = retrieval.SegmentTable.build(
      np.arange(9, dtype=np.int32), np.array([0, 6]), 3
  )
  emb = np.array([[1.0, 0], [2.0, 0], [3.0, 0]], np.float32)
  index = retrieval.SegmentIndex(table, emb, "exact")
  host = decoding.Retriever(index, 3)
  text = np.arange(100, 112, dtype=np.int32)[None]
  own = np.array([[[2.5, 0.0], [9.0, 0.0]]], np.float32)
  sources, mask = host.sources(np.array([[1.0, 0.0]]), own, 1, text)
  # Scores 3 (segment 2), 2.5 (own S_0), 2 (segment 1); segment 0 drops.
  np.testing.assert_array_equal(sources[0, 0], [6, 7, 8, 0, 0, 0])
  np.testing.assert_array_equal(mask[0, 0], [True] * 3 + [False] * 3)
  np.testing.assert_array_equal(sources[0, 1], [100, 101, 102, 103, 104, 105])
  assert mask[0, 1].all()
  np.testing.assert_array_equal(sources[0, 2], [3, 4, 5, 0, 0, 0])
  np.testing.assert_array_equal(mask[0, 2], [True] * 3 + [False] * 3)


@pytest.fixture(scope="module")
def run(marge_smoke_workdir):
  """(LanguageModel, its decoder with the run's index, the training and
  valid streams) of the shared smoke run."""
  lm = memjax.load(marge_smoke_workdir)
  r, s = lm.restored, lm.restored.settings
  dec = lm_decoding.decoder(r.model)
  assert isinstance(dec, decoding.MargeDecoder)
  with pytest.raises(errors.ConfigError, match="index"):
    dec.forced_log_probs(r.variables, [np.arange(3)], np.zeros((1, 2), int))
  dec.prepare_run(r, r.variables)
  corpus = corpus_lib.load_corpus(s.data, s.eval, marge_smoke_workdir)
  return lm, dec, corpus.train, corpus.splits["valid"].tokens


def _marge_eval_log_probs(lm, train, doc):
  """{target stream index q: log p(doc[q])} of ``--mode=marge_eval``'s
  windows over ``doc`` (its retrieval by exact search, its scoring)."""
  model, variables = lm.restored.model, lm.restored.variables
  n, k = model.segment_len, model.num_sources
  table, pool = evaluation.eval_table(train, doc, np.array([0]), n)
  segments = table.segment_tokens(np.arange(len(table)))
  emb = reindex.embed_all(model, variables, segments, 256, lm.restored.mesh)
  index = retrieval.SegmentIndex(table, emb, "exact", pool=pool)
  query = table.targets[table.targets >= pool]
  batch = retrieval.window_arrays(table, query, index.topk(query, k))
  keys = ("inputs", "targets", "sources", "source_mask")

  def fn(mdl, x, y, sources, mask):
    out = mdl(x, y, sources=sources, source_mask=mask, deterministic=True)
    return out.target_logprob

  lp = np.asarray(
      model.apply(
          model_vars.as_variables(variables),
          *(batch[k] for k in keys),
          method=fn,
      )
  )
  out = {}
  for w, t in enumerate(table.pos[query]):
    for r in range(n):
      out[(t + 1) * n + r] = lp[w, n - 1 + r]
  return out


def test_each_step_predicts_as_marge_eval_scores(run):
  """Two texts of 4 segments and a part (N = 8), prompts of 5 and 12
  tokens, in one batch: every prediction of S_1 .. S_3 against
  marge_eval's (sources from the training segments and the text's own
  past), and S_0's against the model with retrieval off."""
  lm, dec, train, valid = run
  model, variables = lm.restored.model, lm.restored.variables
  n = model.segment_len
  docs = [np.asarray(valid[a : a + 4 * n + 3], np.int32) for a in (0, 60)]
  cut = (5, 12)
  width = min(len(d) - c for d, c in zip(docs, cut))
  got = dec.forced_log_probs(
      variables,
      [d[:c] for d, c in zip(docs, cut)],
      np.stack([d[c : c + width] for d, c in zip(docs, cut)]),
  )

  def plain(mdl, x):
    return mdl.log_probs(mdl(x, None, deterministic=True).hidden)

  checked = 0
  for doc, c, rows in zip(docs, cut, got):
    want = _marge_eval_log_probs(lm, train, doc)
    s0 = np.asarray(
        model.apply(
            model_vars.as_variables(variables), doc[None, :n], method=plain
        )
    )[0]
    for q in range(c, min(c + width, 4 * n)):  # S_4 is not whole.
      lp = rows[q - c, doc[q]]
      ref = s0[q - 1, doc[q]] if q < n else want[q]
      np.testing.assert_allclose(lp, ref, atol=1e-5, rtol=0)
      checked += 1
  assert checked == sum(min(c + width, 4 * n) - c for c in cut) == 43


def test_a_batch_gives_each_prompt_what_it_gives_alone(run):
  lm, dec, _, valid = run
  variables = lm.restored.variables
  prompts = [
      np.asarray(valid[a : a + m], np.int32) for a, m in ((0, 3), (40, 11))
  ]
  top_p = sampling_lib.Sampling(top_p=0.9)
  both = dec.generate(variables, prompts, 20, top_p, [4, 5])
  for prompt, seed, row in zip(prompts, (4, 5), both):
    alone = dec.generate(variables, [prompt], 20, top_p, [seed])[0]
    np.testing.assert_array_equal(row, alone)
    assert len(row) == 20
