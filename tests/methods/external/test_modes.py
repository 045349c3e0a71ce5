"""End to end on the smoke run: --mode=datastore, index, recall and tune
with the knn and trime_ext evaluation memories; bad input exits with 2."""

import json
import os

import numpy as np
import pytest

import memjax

from configs import trime_wt103
from memjax import build
from memjax import errors
from memjax.memory import datastore as ds_lib
from memjax.methods.external import modes as external_modes
from memjax.modes import memory_eval as memory_modes
from memjax.run import restore
from tests.conftest import set_memory


def _config(smoke_workdir, kind, **em):
  c = trime_wt103.get_config("smoke")
  c.train.init_from = smoke_workdir
  c.eval.max_windows = 6
  c.datastore.max_windows = 40
  c.datastore.shard_keys = 256
  c.datastore.recall_queries = 64
  c.eval_memory.kind = kind
  c.eval_memory.ext_k = 32
  c.eval_memory.leaves_to_search = 16  # all 16 leaves of a 256-key shard
  set_memory(c, **em)
  return c


@pytest.fixture(scope="module")
def built(smoke_workdir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("extmem"))
  config = _config(smoke_workdir, "trime_ext")
  out = memjax.run_mode("datastore", config, workdir)
  return config, workdir, out


def test_datastore_index_recall_and_tune(built, smoke_workdir):
  config, workdir, out = built
  store = ds_lib.open_datastore(out["path"])
  # 40 windows: the first scores 32 predictions, each later one 16.
  assert store.count == 32 + 39 * 16 == out["keys"]
  assert len(store.keys) > 1 and out["bytes_per_key"] >= 2 * store.dim + 4
  assert store.manifest["split"] == "train"
  assert store.manifest["context"] == {"window_len": 32, "score_len": 16}
  memjax.run_mode("index", config, workdir)
  config.datastore.recall_leaves = (1, 16)
  config.datastore.recall_examples = 2
  res = memjax.run_mode("recall", config, workdir)
  assert res["recall"] >= 0.95 and res["queries"] == 64
  with open(os.path.join(workdir, "recall.json")) as f:
    saved = json.load(f)
  assert saved["recall"] == res["recall"]
  # The curve: searching all 16 leaves finds what the configured 16 find,
  # one leaf finds less or as much.
  one, every = saved["curve"]
  assert (one["leaves_to_search"], every["leaves_to_search"]) == (1, 16)
  assert every["recall"] == res["recall"] and one["recall"] <= res["recall"]
  assert one["ms_per_query"] > 0 and every["ms_per_query"] > 0
  _check_examples(config, workdir, store, saved["examples"])
  # Table 13's accuracy grows with K (K = 1, 8 of the 32 neighbours).
  acc = res["retrieval_accuracy"]
  assert set(acc) == {"1", "8"} and 0 <= acc["1"] <= acc["8"] <= 1
  set_memory(
      config,
      temperature_grid=(1.0,),
      ext_temperature_grid=(5.0,),
      ext_lambda_grid=(0.0, 0.3),
  )
  tuned = memory_modes.tune(build.build(config, workdir))
  # The best setting is the grid's lowest valid NLL, and lambda matters.
  nll = {r["ext_lambda"]: r["nll"] for r in tuned["grid_valid"]}
  assert sorted(nll) == [0.0, 0.3]
  assert nll[0.0] != pytest.approx(nll[0.3], rel=1e-4)
  assert tuned["best"]["ext_lambda"] == min(nll, key=nll.get)
  assert tuned["valid"]["memory"]["nll"] == min(nll.values())
  assert np.isfinite(tuned["test"]["memory"]["ppl"])
  # Table 14's columns with the external memory, at the tuned setting.
  avg = memory_modes.buckets(build.build(config, workdir))["rows"][-1]
  assert avg["tokens"] == tuned["valid"]["memory"]["tokens"]
  memory_ppl = [v for k, v in avg.items() if k.startswith("trime_ext memory")]
  assert memory_ppl == [pytest.approx(tuned["valid"]["memory"]["ppl"])]
  # kNN-LM on the same datastore searched exactly (its own metric, L2).
  knn = _config(smoke_workdir, "knn", search="exact", knn_lambda_grid=(0.0,))
  r = memory_modes.tune(build.build(knn, workdir))
  assert r["test"]["memory"]["nll"] == pytest.approx(
      r["test"]["plain"]["nll"], rel=1e-6
  )


def _check_examples(config, workdir, store, examples):
  """The neighbours of queries 21 and 42 of 64 against NumPy: the top 8
  inner products of the query with every key, and their next tokens."""
  loaded = restore.load_splits(build.build(config, workdir), splits=("valid",))
  valid = np.asarray(loaded.splits["valid"])
  queries = external_modes.held_out_queries(loaded, "valid", 64)
  keys = np.concatenate(store.keys).astype(np.float32)
  values = np.concatenate(store.values)
  assert [e["position"] for e in examples] == [21, 42]
  for e in examples:
    i = e["position"]
    assert e["next"] == valid[i + 1] and e["context"] == list(
        valid[i - 11 : i + 1]
    )
    scores = keys @ queries[i]
    top = np.argsort(-scores, kind="stable")[:8]
    np.testing.assert_allclose(e["scores"], scores[top], rtol=1e-3, atol=1e-3)
    assert e["tokens"] == list(values[top])


def test_bad_input_is_a_user_error_and_changes_nothing(built, smoke_workdir):
  config, workdir, _ = built
  path = os.path.join(workdir, "datastore")
  before = {
      f: os.path.getmtime(os.path.join(path, f)) for f in os.listdir(path)
  }
  # A UserError: memjax.main prints its one line and exits with status 2.
  with pytest.raises(errors.UserError) as e:
    external_modes.index(
        build.build(_config(smoke_workdir, "knn", ext_k=100000), workdir)
    )
  assert str(e.value).startswith("eval_memory.ext_k=100000 must be in [1, 656]")
  with pytest.raises(errors.ResumeError, match="other settings"):
    external_modes.datastore(
        build.build(_config(smoke_workdir, "knn", batch_size=16), workdir)
    )
  # The process share: a k outside [0, n) is one line.
  bad = _config(smoke_workdir, "knn")
  bad.datastore.process_index, bad.datastore.process_count = 2, 2
  with pytest.raises(errors.ConfigError) as e:
    external_modes.datastore(build.build(bad, workdir))
  assert str(e.value) == (
      "datastore.process_index=2 must be in [0, datastore.process_count=2)"
  )
  after = {f: os.path.getmtime(os.path.join(path, f)) for f in os.listdir(path)}
  assert after == before


def test_domain_adaptation_reads_another_corpus_with_the_run_vocab(
    smoke_workdir, tmp_path
):
  """Table 5: a WikiText model, a datastore of iwslt_en's training part and
  iwslt_en's valid scored with kNN-LM, all in the run's word vocabulary."""
  from memjax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
  from memjax.data import sources  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path)
  c = _config(smoke_workdir, "knn", search="exact", knn_lambda_grid=(0.3,))
  c.datastore.max_windows = 10
  c.datastore.corpus = c.eval.corpus = "iwslt_en"
  c.eval.splits = ("valid",)
  s = build.build(c, workdir).settings
  stream = corpus_lib.read_stream(s.data, s.eval, workdir, "valid")
  vocab = corpus_lib.vocabulary(s.data, workdir)  # the run's: WikiText's
  first = open(
      os.path.join(sources.default_data_dir("iwslt_en"), "valid.en"),
      encoding="utf-8",
  ).readline()
  words = sources.tokenize_sentences(first).split()  # 13a: ',' split off
  want = [vocab.encode(w)[0] for w in words] + [vocab.eos_id]
  np.testing.assert_array_equal(stream.tokens[: len(want)], want)
  out = external_modes.datastore(build.build(c, workdir))
  store = ds_lib.open_datastore(out["path"])
  assert out["path"] == os.path.join(workdir, "datastore-iwslt_en")
  assert store.manifest["corpus"] == "iwslt_en" and store.count == 32 + 9 * 16
  r = memory_modes.memeval(build.build(c, workdir))
  assert r["valid"]["memory"]["tokens"] == r["valid"]["plain"]["tokens"] > 0
  assert np.isfinite(r["valid"]["memory"]["ppl"])
  # A byte-level corpus cannot be read with a word vocabulary.
  c.eval.corpus = "text8"
  s = build.build(c, workdir).settings
  with pytest.raises(errors.DataError, match="byte-level"):
    corpus_lib.read_stream(s.data, s.eval, workdir, "valid")
