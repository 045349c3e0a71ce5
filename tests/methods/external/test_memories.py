"""External memory: datastore, exact and ScaNN search, kNN-LM and TRIMELM_ext.

References are NumPy: brute-force neighbours, the kNN-LM distribution and
TRIME's Eq. 6-9 written out per query over M_local u M_long u kNN(M_ext).
"""

import json
import math
import os

import jax
import numpy as np
import pytest

from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax.eval import grid as grid_lib
from memjax.eval import memory_grid as evaluate_memory
from memjax.eval import rows
from memjax import sharding as sharding_lib
from memjax.data import windows
from memjax.memory import datastore as ds_lib
from memjax.eval import external
from memjax.memory import search
from memjax.models import transformer
from tests.models import helpers
from tests.conftest import REPO

WINDOW, SCORE = 8, 3
SIG = {"model": {"d_model": 16}, "name": "tiny", "signature_version": 3}


def _model(vocab=24):
  return transformer.TransformerLM(
      cfg=helpers.tiny(
          vocab,
          dropout=0.0,
      )
  )


@pytest.fixture(scope="module")
def setup(repetitive_setup):
  return repetitive_setup(_model(), WINDOW)


def _spec(tokens, dim=16, shard_batches=1, batch_size=2, sig=SIG):
  return ds_lib.BuildSpec(
      signature=sig,
      checkpoint={"source": "toy", "step": 0},
      dim=dim,
      corpus="toy",
      split="train",
      window_len=WINDOW,
      score_len=SCORE,
      batch_size=batch_size,
      shard_batches=shard_batches,
      num_tokens=len(tokens),
  )


def _windows(model, params, tokens):
  """Per eval window: (start, length, score_from, g, log p_vocab(y), log Z)."""
  out = []
  for start, length, sfrom in windows.eval_windows(
      len(tokens) - 1, WINDOW, SCORE
  ):
    inp = np.zeros((1, WINDOW), np.int32)
    tgt = np.zeros((1, WINDOW), np.int32)
    inp[0, :length] = tokens[start : start + length]
    tgt[0, :length] = tokens[start + 1 : start + length + 1]
    o = model.apply({"params": params}, inp, tgt)
    out.append(
        (
            int(start),
            int(length),
            int(sfrom),
            np.asarray(o.features[0], np.float64),
            np.asarray(o.target_logprob[0], np.float64),
            np.asarray(o.log_z[0], np.float64),
        )
    )
  return out


def _scored_g(model, params, tokens):
  g = {}
  for start, length, sfrom, feats, _, _ in _windows(model, params, tokens):
    for o in range(sfrom, length):
      g[start + o] = feats[o]
  return np.stack([g[p] for p in range(len(tokens) - 1)])


# ---------------------------------------------------------------- datastore


def _files(path):
  return {
      f: open(os.path.join(path, f), "rb").read()
      for f in sorted(os.listdir(path))
      if not f.startswith("index")
  }


def test_datastore_round_trip_resume_and_two_processes(setup, tmp_path):
  model, params, tokens, one = setup
  spec = _spec(tokens)
  full = str(tmp_path / "full")
  store = ds_lib.build(model, params, tokens, spec, full, mesh=one)
  # Keys are g of every scored prediction, in stream order; values y.
  g = _scored_g(model, params, tokens)
  assert store.count == len(tokens) - 1 and len(store.keys) > 2
  keys, vals = store.gather(np.arange(store.count))
  np.testing.assert_allclose(keys, g.astype(np.float16), rtol=1e-3, atol=1e-3)
  np.testing.assert_array_equal(vals, tokens[1:])
  # An interrupted build resumed from its last complete shard.
  part = str(tmp_path / "resumed")
  assert (
      ds_lib.build(
          model, params, tokens, spec, part, mesh=one, stop_after_shards=2
      )
      is None
  )
  with open(os.path.join(part, "shard-00002.keys.tmp"), "wb") as f:
    f.write(b"partial")  # a shard cut short by the interruption
  ds_lib.check_build_dir(part, spec)
  ds_lib.build(model, params, tokens, spec, part, mesh=one)
  # Process 0 and 1 of 2, joined by whichever finishes last.
  two = str(tmp_path / "two")
  assert (
      ds_lib.build(
          model,
          params,
          tokens,
          spec,
          two,
          mesh=one,
          process_index=1,
          process_count=2,
      )
      is None
  )
  ds_lib.build(
      model,
      params,
      tokens,
      spec,
      two,
      mesh=one,
      process_index=0,
      process_count=2,
  )
  want = {k: v for k, v in _files(full).items() if k != "manifest.json"}
  for other in (part, two):
    got = _files(other)
    assert {k: v for k, v in got.items() if k != "manifest.json"} == want
    assert ds_lib.open_datastore(other).count == store.count


def test_resume_after_a_crash_between_a_shards_arrays_and_its_entry(
    setup, tmp_path
):
  # The crash came after shard 2's .keys/.values were renamed into place
  # and before its .json (the shard's entry in the manifest) was written:
  # the arrays are not trusted (here they hold zeros); the shard is written
  # again and the datastore equals an uninterrupted build.
  model, params, tokens, one = setup
  spec = _spec(tokens)
  full = str(tmp_path / "full")
  store = ds_lib.build(model, params, tokens, spec, full, mesh=one)
  part = str(tmp_path / "crashed")
  assert (
      ds_lib.build(
          model, params, tokens, spec, part, mesh=one, stop_after_shards=3
      )
      is None
  )
  os.remove(os.path.join(part, "shard-00002.json"))
  for ext in ("keys", "values"):
    f = os.path.join(part, f"shard-00002.{ext}")
    with open(f, "r+b") as fh:
      fh.write(bytes(os.path.getsize(f)))
  ds_lib.check_build_dir(part, spec)
  resumed = ds_lib.build(model, params, tokens, spec, part, mesh=one)
  assert resumed is not None and resumed.count == store.count
  want = {k: v for k, v in _files(full).items() if k != "manifest.json"}
  got = _files(part)
  assert {k: v for k, v in got.items() if k != "manifest.json"} == want
  np.testing.assert_array_equal(
      resumed.gather(np.arange(resumed.count))[1], tokens[1:]
  )


def test_values_above_int16_survive(tmp_path):
  model = _model(vocab=40000)
  tokens = np.array(
      [39999, 32768, 5, 32767, 33000, 7, 39000, 1, 35000, 2], np.int32
  )
  params = model.init(
      jax.random.PRNGKey(1), tokens[None, :WINDOW], tokens[None, 1 : WINDOW + 1]
  )["params"]
  one = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  store = ds_lib.build(
      model, params, tokens, _spec(tokens), str(tmp_path), mesh=one
  )
  np.testing.assert_array_equal(
      store.gather(np.arange(store.count))[1], tokens[1:]
  )


def _unchanged(path, fn, error):
  before = _files(path)
  with pytest.raises(error) as e:
    fn()
  assert "\n" not in str(e.value)
  assert _files(path) == before
  return str(e.value)


def test_a_datastore_of_an_earlier_version_opens_with_its_model(tmp_path):
  # The signature an earlier version recorded (a fixture export's, version
  # 2) is compared as today's code reads it.
  fixture = os.path.join(REPO, "tests", "fixtures", "families", "decoder_pkm")
  saved = json.load(open(os.path.join(fixture, "export", "export.json")))
  old = saved["signature"]
  assert old["signature_version"] == 2
  config = config_lib.from_json(
      open(os.path.join(fixture, "run", "config.json")).read()
  )
  today = build.build(config, "unused").signature(old["model"]["vocab_size"])
  assert today != old
  rng = np.random.default_rng(0)
  path = str(tmp_path / "ds")
  ds_lib.from_arrays(
      path,
      rng.normal(size=(30, 16)),
      np.arange(30),
      signature=old,
      shard_size=10,
  )
  assert ds_lib.open_datastore(path, signature=today).count == 30
  wider = dict(today, model=dict(today["model"], d_model=99))
  with pytest.raises(errors.CheckpointMismatchError, match="d_model"):
    ds_lib.open_datastore(path, signature=wider)


def test_bad_datastores_fail_with_one_line_and_change_nothing(tmp_path):
  rng = np.random.default_rng(0)
  path = str(tmp_path / "ds")
  ds_lib.from_arrays(
      path,
      rng.normal(size=(30, 16)),
      np.arange(30),
      signature=SIG,
      shard_size=10,
  )
  other = dict(SIG, model={"d_model": 32})
  msg = _unchanged(
      path,
      lambda: ds_lib.open_datastore(path, signature=other),
      errors.CheckpointMismatchError,
  )
  assert "another model" in msg
  _unchanged(
      path,
      lambda: ds_lib.open_datastore(path, dim=32),
      errors.CheckpointMismatchError,
  )
  store = ds_lib.open_datastore(path, signature=SIG, dim=16)
  # Built from another checkpoint of the same model.
  ck = {"source": "/runs/a", "step": 6}
  m = os.path.join(path, "manifest.json")
  man = json.load(open(m))
  man["checkpoint"] = ck
  open(m, "w").write(json.dumps(man))
  assert "step 6" in _unchanged(
      path,
      lambda: ds_lib.open_datastore(path, checkpoint=dict(ck, step=7)),
      errors.CheckpointMismatchError,
  )
  ds_lib.open_datastore(path, checkpoint=ck)
  assert "holds 30 keys" in _unchanged(
      path, lambda: search.check_k(store, 31), errors.ConfigError
  )
  # Building into it with another model's signature.
  tokens = np.arange(12)
  _unchanged(
      path,
      lambda: ds_lib.check_build_dir(path, _spec(tokens)),
      errors.DataError,
  )
  # Another dtype, a truncated and a missing shard.
  m = os.path.join(path, "manifest.json")
  text = open(m).read()
  open(m, "w").write(text.replace('"float16"', '"float32"'))
  assert "float32" in _unchanged(
      path, lambda: ds_lib.open_datastore(path), errors.DataError
  )
  open(m, "w").write(text)
  k1 = os.path.join(path, "shard-00001.keys")
  data = open(k1, "rb").read()
  open(k1, "wb").write(data[:-2])
  assert "truncated" in _unchanged(
      path, lambda: ds_lib.open_datastore(path), errors.DataError
  )
  os.remove(k1)
  assert "missing" in _unchanged(
      path, lambda: ds_lib.open_datastore(path), errors.DataError
  )


def test_resume_with_other_settings_is_refused(setup, tmp_path):
  model, params, tokens, one = setup
  path = str(tmp_path)
  ds_lib.build(
      model, params, tokens, _spec(tokens), path, mesh=one, stop_after_shards=1
  )
  _unchanged(
      path,
      lambda: ds_lib.check_build_dir(path, _spec(tokens, shard_batches=2)),
      errors.ResumeError,
  )
  _unchanged(
      path,
      lambda: ds_lib.check_build_dir(
          path, _spec(tokens, sig=dict(SIG, model={"d_model": 8}))
      ),
      errors.CheckpointMismatchError,
  )


# ------------------------------------------------------------------- search


@pytest.mark.newest
@pytest.mark.parametrize("metric", ["dot_product", "squared_l2"])
def test_exact_topk_matches_numpy(metric):
  rng = np.random.default_rng(1)
  q = rng.normal(size=(7, 12)).astype(np.float32)
  keys = rng.normal(size=(301, 12)).astype(np.float16)
  s, i = search.exact_topk(q, keys, 20, metric, block=64)
  k32 = keys.astype(np.float64)
  ref = (
      q @ k32.T
      if metric == "dot_product"
      else -((q[:, None, :] - k32[None]) ** 2).sum(-1)
  )
  order = np.argsort(-ref, axis=1)[:, :20]
  np.testing.assert_array_equal(i, order)
  np.testing.assert_allclose(s, np.take_along_axis(ref, order, 1), rtol=1e-5)
  # Fewer keys than k: padded with -1.
  _, i = search.exact_topk(q, keys[:5], 8, metric)
  assert (i[:, 5:] == -1).all() and (np.sort(i[:, :5], 1) == np.arange(5)).all()


def test_scann_recall_on_clustered_data_and_reload(tmp_path):
  rng = np.random.default_rng(2)
  centers = rng.normal(size=(40, 16)) * 3
  keys = centers[rng.integers(0, 40, 6000)] + rng.normal(size=(6000, 16))
  queries = centers[rng.integers(0, 40, 64)] + rng.normal(size=(64, 16))
  store = ds_lib.from_arrays(
      str(tmp_path / "a"),
      keys,
      np.arange(6000) % 97,
      signature=SIG,
      shard_size=2500,
  )
  for metric in ("dot_product", "squared_l2"):
    exact = search.ExactSearcher(store, metric)
    built = search.build_index(store, metric, 50, leaves_to_search=15)
    e_s, e_i = exact.search(queries, 50)
    a_s, a_i = built.search(queries, 50)
    # Stated bound: recall@50 >= 0.95 with sqrt(n) leaves, 15 of 50 searched.
    assert search.recall_at_k(a_i, e_i) >= 0.95
    # Scores of the found neighbours are exact (re-ordered on float32 keys).
    r_s, r_v = search.exact_scores(store, queries, a_i, metric)
    np.testing.assert_allclose(a_s, r_s, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(r_v, (a_i % 97))
    # Reloaded, not rebuilt, from a datastore moved elsewhere.
    os.rename(tmp_path / "a", tmp_path / "b")
    loaded = search.load_index(
        ds_lib.open_datastore(str(tmp_path / "b")), metric
    )
    np.testing.assert_array_equal(loaded.search(queries, 50)[1], a_i)
    os.rename(tmp_path / "b", tmp_path / "a")
  # Each build has its own id (a searcher cached from another is stale).
  first = search.index_id(store, "dot_product")
  search.build_index(store, "dot_product", 50, reorder=-1)
  assert "" != first != search.index_id(store, "dot_product")
  assert search.index_id(ds_lib.open_datastore(str(tmp_path / "a")), "x") == ""
  # A datastore rebuilt under the index: the index no longer matches.
  ds_lib.from_arrays(
      str(tmp_path / "a"),
      keys[:5000],
      np.arange(5000),
      signature=SIG,
      shard_size=2500,
  )
  store = ds_lib.open_datastore(str(tmp_path / "a"))
  with pytest.raises(errors.DataError, match="does not match"):
    search.load_index(store, "dot_product")


@pytest.mark.parametrize("metric", ["dot_product", "squared_l2"])
def test_rescore_or_the_scores_as_the_index_returns_them(tmp_path, metric):
  """eval_memory.rescore: True recomputes the K scores from the stored keys;
  False keeps the search's (the authors' --no-load-keys), which an index
  without re-ordering quantises and the default index does not."""
  rng = np.random.default_rng(4)
  keys = rng.normal(size=(600, 16))
  queries = rng.normal(size=(9, 16)).astype(np.float32)
  store = ds_lib.from_arrays(
      str(tmp_path / "s"),
      keys,
      np.arange(600) % 97,
      signature=SIG,
      shard_size=600,
  )
  k16 = np.asarray(store.keys[0], np.float64)  # as stored (float16)
  got = {}
  for reorder in (0, -1):
    index = search.build_shard_index(
        store.keys[0], metric, 8, leaves_to_search=24, reorder=reorder
    )
    searcher = search.ScannSearcher(store, metric, [index], 24)
    found, idx = searcher.search(queries, 8)
    assert (idx >= 0).all()
    for rescore in (True, False):
      s, v = external.ExternalSearch(searcher, 8, rescore=rescore).neighbours(
          queries
      )
      np.testing.assert_array_equal(v, idx % 97)
      got[reorder, rescore] = s
    np.testing.assert_array_equal(got[reorder, False], found)
    picked = k16[idx]  # [Q, 8, D]
    want = (
        np.einsum("qd,qkd->qk", queries, picked)
        if metric == "dot_product"
        else -((picked - queries[:, None]) ** 2).sum(-1)
    )
    np.testing.assert_allclose(got[reorder, True], want, rtol=1e-5, atol=1e-4)
  # Re-ordered on exact keys: the index's scores are the exact ones.
  np.testing.assert_allclose(got[0, False], got[0, True], rtol=1e-5, atol=1e-4)
  # Not re-ordered: quantised, far from them.
  assert np.abs(got[-1, False] - got[-1, True]).max() > 0.1
  assert config_lib.base_config().eval_memory.rescore is False


# --------------------------------------------------------------- evaluation


def _grid(kind, **values):
  """The grid of the evaluation memory ``kind`` (the run's memories)."""
  return grid_lib.make(build.parts().eval_memories, kind, **values)


def _score(setup, grid, ext, **kw):
  """``grid`` scored by the shipped ``MemoryScorer`` for the model alone,
  with the external memory ``ext``."""
  model, params, tokens, one = setup
  kw.setdefault("long_span", "before_window")
  scorer = evaluate_memory.MemoryScorer(
      rows.Scoring(model, one, "ppl"),
      grid,
      external=ext,
      window_len=WINDOW,
      score_len=SCORE,
      batch_size=2,
      block_size=4,
      **kw,
  )
  return scorer.score_grid(params, tokens, keep_tokens=True)


@pytest.fixture(scope="module")
def hand_store(tmp_path_factory):
  rng = np.random.default_rng(3)
  keys = rng.normal(size=(40, 16)) * 2.0
  values = np.arange(40) % 24  # every token of the toy vocabulary
  return ds_lib.from_arrays(
      str(tmp_path_factory.mktemp("hand")),
      keys,
      values,
      signature=SIG,
      shard_size=15,
  )


def _memories(setup, n_long):
  """Per prediction p: (g, y, log p_vocab(y), log Z, M_local u M_long)."""
  model, params, tokens, _ = setup
  windows = _windows(model, params, tokens)
  scored = _scored_g(model, params, tokens)
  out = {}
  for start, length, sfrom, g, tlp, lz in windows:
    for o in range(sfrom, length):
      mem = [(g[j], tokens[start + j + 1]) for j in range(o)]
      mem += [
          (scored[j], tokens[j + 1])
          for j in range(max(start - n_long, 0), start)
      ]
      out[start + o] = (g[o], tokens[start + o + 1], tlp[o], lz[o], mem)
  return [out[p] for p in range(len(tokens) - 1)]


def _ext(store, q, k, metric):
  keys, vals = store.gather(np.arange(store.count))
  keys = keys.astype(np.float64)
  s = keys @ q if metric == "dot_product" else -((keys - q) ** 2).sum(-1)
  top = np.argsort(-s)[:k]
  return [(keys[j], vals[j], s[j]) for j in top]


def test_knn_lm_at_lambda_0_is_the_model_and_at_1_numpy_knn(setup, hand_store):
  k = 12
  grid = _grid("knn", knn_temperatures=(1.0, 3.0), knn_lambdas=(0.0, 1.0, 0.25))
  ext = external.ExternalSearch(
      search.ExactSearcher(hand_store, "squared_l2"), k
  )
  r = _score(setup, grid, ext)
  lp = r["grid_logprob"].reshape(2, 3, -1)  # [T, lambda, P]
  np.testing.assert_array_equal(lp[0, 0], r["lm_logprob"])
  np.testing.assert_array_equal(lp[1, 0], r["lm_logprob"])
  for ti, temp in enumerate((1.0, 3.0)):
    ref = []
    for g, y, tlp, _, _ in _memories(setup, 0):
      nb = _ext(hand_store, g, k, "squared_l2")
      w = np.array([math.exp(s / temp) for _, _, s in nb])
      p_knn = sum(wi for wi, (_, v, _) in zip(w, nb) if v == y) / w.sum()
      ref.append(
          (
              math.log(p_knn) if p_knn > 0 else -np.inf,
              math.log(0.75 * math.exp(tlp) + 0.25 * p_knn),
          )
      )
    ref = np.array(ref)
    np.testing.assert_allclose(lp[ti, 1], ref[:, 0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lp[ti, 2], ref[:, 1], rtol=1e-4, atol=1e-4)


def test_trime_ext_with_empty_external_memory_is_local_and_long(setup):
  trime = _grid("trime", long_sizes=(0, 5), temperatures=(0.7, 1.3))
  ext_grid = _grid(
      "trime_ext",
      long_sizes=(0, 5),
      temperatures=(0.7, 1.3),
      ext_temperatures=(2.0,),
      ext_lambdas=(0.0,),
  )
  want = _score(setup, trime, None)["grid_logprob"]
  got = _score(setup, ext_grid, external.ExternalSearch(None, 0))
  np.testing.assert_allclose(got["grid_logprob"], want, rtol=1e-6, atol=1e-6)


def test_trime_ext_matches_eq_6_to_9(setup, hand_store):
  k, n_long, taus, tau2, lams = 6, 5, (0.8, 1.5), (2.0, 5.0), (0.0, 0.3)
  grid = _grid(
      "trime_ext",
      long_sizes=(n_long,),
      temperatures=taus,
      ext_temperatures=tau2,
      ext_lambdas=lams,
      ext_interp_locals=(0.0, 1.0),
  )
  ext = external.ExternalSearch(
      search.ExactSearcher(hand_store, "dot_product"), k
  )
  got = _score(setup, grid, ext)["grid_logprob"].reshape(2, 2, 2, 2, -1)
  d = 16
  for p, (g, y, tlp, lz, mem) in enumerate(_memories(setup, n_long)):
    nb = [(key, v) for key, v, _ in _ext(hand_store, g, k, "dot_product")]
    mem = mem + nb
    sims = np.array([g @ key / math.sqrt(d) for key, _ in mem])
    pos = np.array([v == y for _, v in mem])
    ext_only = np.arange(len(mem)) >= len(mem) - k
    for a, tau in enumerate(taus):
      e = np.exp(sims / tau)
      p6 = (math.exp(lz + tlp) + e[pos].sum()) / (math.exp(lz) + e.sum())
      for b, t2 in enumerate(tau2):
        # tau' divides the raw inner product (the authors' units).
        e2 = np.exp(sims * math.sqrt(d) / t2)
        p8 = [
            e2[pos & ext_only].sum() / e2[ext_only].sum(),  # the neighbours
            e2[pos].sum() / e2.sum(),  # all of M_eval
        ]
        for c, lam in enumerate(lams):
          for i in range(2):
            want = math.log((1 - lam) * p6 + lam * p8[i])
            assert got[a, b, c, i, p] == pytest.approx(want, rel=1e-4, abs=1e-4)


# A query whose target is in M_local only (TRIME's evaluation, hand-worked):
# window positions 0..3 with features G and next tokens Y; the query is
# position 3 (target 4, which only position 1 also precedes); three external
# neighbours (raw inner products 4, 4, 3 with the query) of tokens 1, 2, 3.
_G = np.array([[1, 0, 2, 0], [2, 1, 0, 1], [0, 1, 1, 0], [1, 2, 0, 1]], float)
_Y = np.array([2, 4, 0, 4])
_EXT_KEYS = np.array([[1, 1, 1, 1], [0, 2, 0, 0], [3, 0, 0, 0]], float)
_EXT_VALS = np.array([1, 2, 3])
_LOGITS = np.array([0.5, -1.0, 0.2, 1.0, 0.1])  # the vocabulary's, V = 5


def _lse(x):
  m = np.max(x)
  return m + np.log(np.sum(np.exp(x - m)))


def _authors_trime_generate(tau, tau2, lam):
  """A NumPy port of princeton-nlp/TRIME's ``SequenceScorer.trime_generate``
  (fairseq/sequence_scorer.py) at mode 'gn' with --use-local,
  --use-external and --use-interp, for the query at position 3."""
  d, i, y = _G.shape[1], 3, _Y[3]
  norm_t = _lse(_LOGITS)  # lines 131-134
  token_logprob = _LOGITS[y] - norm_t
  # retrieve_logits, lines 79-86: earlier positions of the window; the
  # triu mask adds -10000 at j >= i.
  local = _G @ _G[i] / math.sqrt(d) / tau
  local = local + np.where(np.arange(4) >= i, -10000.0, 0.0)
  # retrieve_from_ds, lines 39-52: raw inner products / sqrt(d) / tau.
  dists = _EXT_KEYS @ _G[i]
  aug = np.concatenate([local, dists / math.sqrt(d) / tau])
  labels = np.concatenate([_Y, _EXT_VALS])
  norm_c = _lse(aug)  # lines 146-155
  ctx_prob = _lse(aug - norm_c + (labels != y) * -10000.0)
  norm_tpc = np.logaddexp(norm_t, norm_c)
  avg = np.logaddexp(
      token_logprob + norm_t - norm_tpc, ctx_prob + norm_c - norm_tpc
  )
  # knnlm.py 139-146: log_softmax(dists / temp) over the K neighbours.
  probs = dists / tau2 - _lse(dists / tau2)
  knn = _lse(probs + np.where(_EXT_VALS == y, 0.0, -10000.0))
  # combine_knn_and_vocab_probs, lines 100-107 and 181.
  return np.logaddexp(avg + np.log(1 - lam), knn + np.log(lam))


def _eq_8_text(tau, tau2, lam):
  """Eq. 6 and Eq. 8-9 of the paper for the same query, P' over all of
  M_eval = M_local u kNN(M_ext) at g . g_j / tau'."""
  d, i, y = _G.shape[1], 3, _Y[3]
  keys = np.concatenate([_G[:i], _EXT_KEYS])
  vals = np.concatenate([_Y[:i], _EXT_VALS])
  sim = keys @ _G[i]
  e6 = np.exp(sim / math.sqrt(d) / tau)
  z = np.exp(_LOGITS).sum()
  p6 = (np.exp(_LOGITS[y]) + e6[vals == y].sum()) / (z + e6.sum())
  e8 = np.exp(sim / tau2)
  p8 = e8[vals == y].sum() / e8.sum()
  return math.log((1 - lam) * p6 + lam * p8), math.log(p6)


def test_trime_ext_hand_worked_authors_code_and_eq_8_text():
  from memjax.memory import evaluation  # pylint: disable=g-import-not-at-top
  from memjax.methods.external import memories  # pylint: disable=g-import-not-at-top

  memory = memories.TrimeExtMemory()
  taus, tau2s, lams = (1.25,), (10.5, 2.0), (0.3,)
  settings = {
      "temperatures": taus,
      "ext_temperatures": tau2s,
      "ext_lambdas": lams,
      "ext_interp_locals": (0.0, 1.0),
  }
  scales = np.asarray(memory.scales(settings, 4), np.float32)
  f32 = lambda x: np.asarray(x, np.float32)[None]  # noqa: E731
  sums = evaluation.local_sums(
      f32(_G[3:]),
      np.array([[3]]),
      np.array([[4]]),
      f32(_G),
      np.array([_Y]),
      np.ones((1, 4), bool),
      scales,
  )
  log_z = _lse(_LOGITS)
  out = {
      "sums": np.stack([np.stack(sums)]),  # [N, 2, G, W, S]
      "lm": np.array([[_LOGITS[4] - log_z]], np.float32),
      "log_z": np.array([[log_z]], np.float32),
      "targets": np.array([[4]]),
      "weights": np.ones((1, 1), np.float32),
  }
  got = external.make_combine_fn(memory, settings, 4)(
      out, f32([_EXT_KEYS @ _G[3]]), np.array([[_EXT_VALS]])
  )
  got = np.asarray(got).reshape(2, 2)  # [tau', ext_interp_local]
  for b, tau2 in enumerate(tau2s):
    authors = _authors_trime_generate(1.25, tau2, 0.3)
    text, log_p6 = _eq_8_text(1.25, tau2, 0.3)
    # The target is not among the neighbours: the authors' P' is 0 there.
    assert authors == pytest.approx(math.log(0.7) + log_p6, rel=1e-9)
    assert got[b, 0] == pytest.approx(authors, rel=1e-5)
    assert got[b, 1] == pytest.approx(text, rel=1e-5)
    assert abs(text - authors) > 0.05


def test_trime_ext_default_memory_scale_at_d_1024_is_the_authors():
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax import config as config_lib  # pylint: disable=g-import-not-at-top

  c = config_lib.base_config()
  c.eval_memory.kind = "trime_ext"
  parts = build.parts()
  s = build.read(c, parts)
  memories = parts.eval_memories
  grid = grid_lib.configured_grid(s, memories)
  assert grid.values()["ext_interp_locals"] == (0.0,)  # the neighbours only
  scales = grid.memory.scales(grid.values(), 1024)
  assert scales == [1 / (32 * c.trime.temperature), 1 / 10.5]
  tuning = grid_lib.tuning_grid(s, memories, "trime_ext").values()
  taus = tuning["ext_temperatures"]
  assert min(taus) < 10.5 < 40.0 < max(taus)  # README's values inside


def test_knn_lm_with_a_cache_matches_numpy_and_both_parts(setup, hand_store):
  k, n_long, thetas, lam_c, temps, lams = (
      9,
      5,
      (0.3,),
      (0.0, 0.2),
      (2.0,),
      (0.0, 0.4),
  )
  kw = dict(long_sizes=(n_long,), thetas=thetas, lambdas=lam_c)
  grid = _grid("knn_cache", knn_temperatures=temps, knn_lambdas=lams, **kw)
  ext = external.ExternalSearch(
      search.ExactSearcher(hand_store, "squared_l2"), k
  )
  got = _score(setup, grid, ext)["grid_logprob"].reshape(2, 2, -1)
  knn = _score(
      setup,
      _grid("knn", knn_temperatures=temps, knn_lambdas=lams),
      ext,
  )
  cache_only = _score(setup, _grid("cache", **kw), None)
  # lam_c = 0: the kNN-LM; lam = 0: the model with the cache.
  np.testing.assert_allclose(
      got[0], knn["grid_logprob"].reshape(2, -1), rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(
      got[:, 0],
      cache_only["grid_logprob"].reshape(2, -1),
      rtol=1e-6,
      atol=1e-6,
  )
  for p, (g, y, tlp, _, mem) in enumerate(_memories(setup, n_long)):
    nb = _ext(hand_store, g, k, "squared_l2")
    w = np.array([math.exp(s / temps[0]) for _, _, s in nb])
    p_knn = sum(wi for wi, (_, v, _) in zip(w, nb) if v == y) / w.sum()
    p1 = 0.6 * math.exp(tlp) + 0.4 * p_knn
    if mem:
      e = np.exp(np.array([thetas[0] * (g @ key) for key, _ in mem]))
      p_cache = sum(ei for ei, (_, v) in zip(e, mem) if v == y) / e.sum()
      p1 = 0.8 * p1 + 0.2 * p_cache
    assert got[1, 1, p] == pytest.approx(math.log(p1), rel=1e-4, abs=1e-4)


def test_pipelined_search_equals_sequential(setup, hand_store):
  grid = _grid("knn", knn_temperatures=(1.0,), knn_lambdas=(0.3,))
  out = []
  for pipeline in (True, False):
    ext = external.ExternalSearch(
        search.ExactSearcher(hand_store, "squared_l2"), 7, pipeline=pipeline
    )
    out.append(_score(setup, grid, ext))
  np.testing.assert_array_equal(out[0]["grid_logprob"], out[1]["grid_logprob"])
  assert out[0]["grid"] == out[1]["grid"]


def test_retrieval_accuracy_hand_worked(tmp_path):
  from memjax.methods.external import modes as external_modes  # pylint: disable=g-import-not-at-top

  store = ds_lib.from_arrays(
      str(tmp_path), np.zeros((4, 2)), np.array([5, 6, 7, 8]), signature=SIG
  )
  idx = np.array([[0, 1, 2], [3, 2, -1], [2, 0, 1]])
  acc = external_modes.retrieval_accuracy(
      store, idx, np.array([6, 9, 7]), ks=(1, 2, 3, 8)
  )
  # q0 finds 6 at rank 2, q1 never finds 9, q2 finds 7 at rank 1.
  assert acc == {"1": 1 / 3, "2": 2 / 3, "3": 2 / 3}


def test_scann_index_of_a_datastore_rebuilt_with_the_same_sizes(tmp_path):
  # Same key count and shard sizes, other keys: only the datastore's
  # identity tells the index is stale.
  rng = np.random.default_rng(5)
  path = str(tmp_path / "a")
  keys = rng.normal(size=(600, 8)).astype(np.float32)
  store = ds_lib.from_arrays(
      path, keys, np.arange(600) % 7, signature=SIG, shard_size=300
  )
  search.build_index(store, "dot_product", 10)
  search.load_index(ds_lib.open_datastore(path), "dot_product")
  ds_lib.from_arrays(
      path, -keys, np.arange(600) % 7, signature=SIG, shard_size=300
  )
  store = ds_lib.open_datastore(path)
  assert [len(v) for v in store.values] == [300, 300]
  with pytest.raises(errors.DataError, match="does not match"):
    search.load_index(store, "dot_product")
