"""The modified-MARGE LM on a planted corpus (issue: 'a planted corpus').

The corpus is random words in lines of N - 1 words (one line + its EOS =
one segment of N tokens). Every article is a heading (two segments) then a
chain of random segments. Most chains occur in two training articles, so that
copying from a retrieved source's continuation pays during training; each
test article is (heading, A, B) where the training split holds the chain
(A, B, C) once: B, the planted continuation, and its query segment A are
copied verbatim (with A's words partly replaced, the embedder of a short
run found the source far less often; see docs/marge.md).

The MARGE model (``configs/marge_wt103.py:planted``, beta starting at 0)
and the vanilla LM of the same size (``vanilla_planted``) are trained the
same number of steps by ``python -m memjax.main --mode=train``, side by
side in one-device processes (the eight fake devices' collectives would
only slow these tiny models). Then, with the
shipped index (``marge_index.embed_all``, ``marge.SegmentIndex``, exact
search, the causal mask of ``--mode=marge_eval``):

* beta > 0: it starts at 0, so the growth is learnt, not initialised;
* the training segment A is among the top-k of e(A) far above chance
  (k / number of allowed candidates; with an exact copy of A this checks
  the index, the search and the causal mask rather than the embedder);
* the mean loss on B's tokens with retrieval is below the same model's
  with retrieval off and below the vanilla LM's on the same window.
"""

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

from memjax import build
from memjax.data import corpus as corpus_lib
from memjax.eval import scorer as scorer_lib
from memjax.methods.marge import retrieval as marge_lib
from memjax.methods.marge import reindex as marge_index
from memjax.methods.marge import evaluation as marge_eval
from memjax.run import restore as restore_lib
from tests import conftest

N = 4  # segment_len of the 'planted' variant
WORDS = [f"w{i}" for i in range(96)]
TWICE, ONCE = 300, 32


def _line(words) -> str:
  return " " + " ".join(words) + " \n"


def _corpus(root) -> str:
  """Writes wiki.{train,valid,test}.tokens; returns the directory."""
  rng = np.random.default_rng(0)
  seg = lambda: list(rng.choice(WORDS, N - 1))
  # ' = doc = ' (4 tokens with its EOS) + 3 words + EOS: 8 tokens, the
  # heading segments S_0 S_1.
  head = " = doc = \n" + _line(["a", "b", "c"])
  train, test = [], []
  for _ in range(TWICE):
    chain = "".join(_line(seg()) for _ in range(3))
    train += [head + chain, head + chain]
  for _ in range(ONCE):
    a, b, c = seg(), seg(), seg()
    train.append(head + _line(a) + _line(b) + _line(c))
    test.append(head + _line(a) + _line(b))
  data = root / "planted_data"
  data.mkdir()
  order = rng.permutation(len(train))
  (data / "wiki.train.tokens").write_text("".join(train[i] for i in order))
  for split in ("valid", "test"):
    (data / f"wiki.{split}.tokens").write_text("".join(test))
  return str(data)


def _config(variant: str, data_dir: str):
  c = importlib.import_module("configs.marge_wt103").get_config(variant)
  c.data.data_dir = data_dir
  return c


def _load_for_mode(config, workdir):
  """What an analysis mode reads: the run of ``workdir`` restored with
  ``config``, and its evaluation splits (no training split, no batcher)."""
  run = build.build(config, workdir)
  corpus = corpus_lib.load_corpus(
      run.settings.data, run.settings.eval, workdir, train=False
  )
  return run, restore_lib.restore_source(run), corpus


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
  """Trains both runs and measures what the tests check."""
  root = tmp_path_factory.mktemp("planted")
  data = _corpus(root)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  runs = {v: str(root / v) for v in ("planted", "vanilla_planted")}
  # Both runs train at once, each in a one-device process (as a user runs
  # memjax.main): the tiny models train faster without the eight fake
  # devices' collectives. They run 300 steps each, so XLA optimises them
  # (no conftest.COMPILE_FLAGS).
  procs = [
      subprocess.Popen(
          [
              sys.executable,
              "-m",
              "memjax.main",
              "--mode=train",
              f"--config=configs/marge_wt103.py:{v}",
              f"--config.data.data_dir={data}",
              f"--workdir={w}",
          ],
          cwd=conftest.REPO,
          env=env,
          stdout=subprocess.DEVNULL,
          stderr=subprocess.PIPE,
          text=True,
      )
      for v, w in runs.items()
  ]
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
  config = _config("planted", data)
  run, restored, corpus = _load_for_mode(config, runs["planted"])
  train = corpus_lib.load_corpus(
      run.settings.data, run.settings.eval, runs["planted"], (), True
  ).train
  test = corpus.splits["test"]
  table, pool = marge_eval.eval_table(
      train, np.asarray(test.tokens), np.asarray(test.doc_starts), N
  )
  emb = marge_index.embed_all(
      restored.model,
      restored.params,
      table.segment_tokens(np.arange(len(table))),
      256,
      restored.mesh,
  )
  index = marge_lib.SegmentIndex(table, emb, "exact", pool=pool)
  # A follows the heading's 8 tokens: it is segment 8 // N of its article.
  query = np.flatnonzero(
      (np.arange(len(table)) >= pool) & (table.pos == 8 // N)
  )
  k = restored.model.num_sources
  ids = index.topk(query, k)
  # The planted source: the training segment whose continuation is B.
  b = table.segment_tokens(table.next[query])
  cont = table.segment_tokens(np.maximum(table.next[np.maximum(ids, 0)], 0))
  hit = ((cont == b[:, None]).all(-1) & (ids >= 0) & (ids < pool)).any(-1)
  # Chance by hand: a query may retrieve any of the pool's training
  # segments and the segments before it in its own article (its position).
  candidates = pool + table.pos[query]
  everything = np.broadcast_to(np.arange(len(table)), (len(query), len(table)))
  np.testing.assert_array_equal(
      table.allowed(query, everything, pool).sum(1), candidates
  )
  batch = marge_lib.window_arrays(table, query, ids)
  scored = batch["weights"] > 0  # the N tokens of B
  _, vanilla, _ = _load_for_mode(
      _config("vanilla_planted", data), runs["vanilla_planted"]
  )
  scorer = scorer_lib.scorer_for(restored.scoring())
  plain = scorer_lib.scorer_for(vanilla.scoring())
  nll = {
      "retrieval": marge_eval.score(scorer, restored.params, batch, True),
      "no_retrieval": marge_eval.score(scorer, restored.params, batch, False),
      "vanilla": marge_eval.score(plain, vanilla.params, batch, False),
  }
  out = {name: float(v[scored].mean()) for name, v in nll.items()}
  out.update(
      beta=float(restored.params["beta"]),
      hit_rate=float(hit.mean()),
      chance=float(np.mean(k / candidates)),
  )
  print("planted corpus:", out)
  return out


def test_beta_grows_from_zero(planted):
  # beta_init is 0 in the 'planted' variant: a positive beta is learnt
  # (measured: 0.94 after 300 steps).
  assert planted["beta"] > 0.3, planted


def test_planted_source_retrieved_far_above_chance(planted):
  # Measured: 32 of 32 planted sources in the top-2, chance 0.0006.
  assert planted["chance"] < 0.01, planted
  assert planted["hit_rate"] >= 0.75, planted


def test_planted_tokens_loss_below_vanilla_and_retrieval_off(planted):
  # Measured (nats per token of B): 1.55 with retrieval, 3.82 without,
  # 3.40 for the vanilla LM (ln 96 = 4.56 for a uniform guess).
  on = planted["retrieval"]
  assert on < planted["no_retrieval"] - 0.5, planted
  assert on < planted["vanilla"] - 0.5, planted
