"""Evaluation with testing memories against NumPy references written from Eq. 6."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax import build
from memjax import errors
from memjax import sharding as sharding_lib
from memjax.data import windows as data_windows
from memjax.eval import grid as grid_lib
from memjax.eval import memory_grid as evaluate_memory
from memjax.eval import rows
from memjax.eval import windows
from memjax.memory import evaluation
from memjax.models import transformer
from tests.models import helpers

WINDOW, SCORE = 8, 3


def _score_stream(
    model, params, tokens, grid, *, mesh, keep_tokens=False, **kw
):
  """``grid`` scored over ``tokens`` by the shipped ``MemoryScorer``, for a
  model alone (no run: ``kw`` are the scorer's settings)."""
  kw.setdefault("long_span", "before_window")
  scorer = evaluate_memory.MemoryScorer(
      rows.Scoring(model, mesh, "ppl"), grid, **kw
  )
  return scorer.score_grid(params, tokens, keep_tokens=keep_tokens)


def _model():
  return transformer.TransformerLM(
      cfg=helpers.tiny(
          24,
          dropout=0.0,
      )
  )


def _grid(kind, long_sizes, **values):
  """The grid of the evaluation memory ``kind`` (the run's memories)."""
  return grid_lib.make(build.parts().eval_memories, kind, long_sizes, **values)


@pytest.fixture(scope="module")
def setup(repetitive_setup):
  return repetitive_setup(_model(), WINDOW)


def _window_outputs(model, params, tokens):
  """Per eval_windows window: (start, length, score_from, g, tlp, log_z)."""
  out = []
  for start, length, sfrom in data_windows.eval_windows(
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


def reference(
    model,
    params,
    tokens,
    kind,
    n_long,
    tau=1.0,
    theta=0.0,
    lam=0.0,
    span="before_window",
):
  """log p of every prediction, straight from Eq. 6 / Grave et al., float64;
  M_long is the N predictions before the window, or (span='last_scored')
  the N before the window's first scored one."""
  windows = _window_outputs(model, params, tokens)
  scored_g = {}
  for start, length, sfrom, g, _, _ in windows:
    for o in range(sfrom, length):
      scored_g[start + o] = g[o]
  d = windows[0][3].shape[-1]
  logp = {}
  for start, length, sfrom, g, tlp, lz in windows:
    for o in range(sfrom, length):
      p = start + o
      y = tokens[p + 1]
      memory = [(g[j], tokens[start + j + 1]) for j in range(o)]  # M_local
      end = start + sfrom if span == "last_scored" else start
      memory += [
          (scored_g[j], tokens[j + 1])  # M_long
          for j in range(max(end - n_long, 0), end)
      ]
      if kind == "trime":
        sims = [np.exp(g[o] @ k / math.sqrt(d) / tau) for k, _ in memory]
        num = math.exp(lz[o] + tlp[o]) + sum(
            s for s, (_, x) in zip(sims, memory) if x == y
        )
        den = math.exp(lz[o]) + sum(sims)
        logp[p] = math.log(num / den)
      else:
        if not memory:
          logp[p] = tlp[o]
          continue
        sims = np.array([np.exp(theta * g[o] @ k) for k, _ in memory])
        pos = sum(s for s, (_, x) in zip(sims, memory) if x == y)
        logp[p] = math.log(
            (1 - lam) * math.exp(tlp[o]) + lam * pos / sims.sum()
        )
  return np.array([logp[p] for p in range(len(tokens) - 1)])


@pytest.mark.parametrize(
    "n_long, span",
    [
        (0, "before_window"),
        (5, "before_window"),
        (13, "before_window"),
        (5, "last_scored"),
        (13, "last_scored"),
    ],
)
def test_trime_evaluation_matches_numpy(setup, n_long, span):
  model, params, tokens, one = setup
  grid = _grid("trime", long_sizes=(n_long,), temperatures=(0.7,))
  r = _score_stream(
      model,
      params,
      tokens,
      grid,
      window_len=WINDOW,
      score_len=SCORE,
      batch_size=2,
      mesh=one,
      block_size=4,
      keep_tokens=True,
      long_span=span,
  )
  ref = reference(model, params, tokens, "trime", n_long, tau=0.7, span=span)
  np.testing.assert_array_equal(r["positions"], np.arange(len(tokens) - 1))
  np.testing.assert_allclose(r["grid_logprob"][0], ref, rtol=2e-5, atol=2e-5)
  assert r["grid"][0]["nll"] == pytest.approx(-ref.mean(), rel=1e-5)


def test_long_memory_spans_hand_listed():

  # A stream of 21 tokens (20 predictions), windows of T = 8 scoring S = 3:
  # the windows score [0, 3), [3, 6), [6, 8) (three copies of the first
  # window [0, 8), one window for the authors), [8, 11), [11, 14), [14, 17)
  # and [17, 20); from the fourth on, each starts 5 predictions before the
  # first it scores. M_long of N = 5, per window:
  want = {
      "before_window": [
          [],
          [],
          [],
          [0, 1, 2],
          [1, 2, 3, 4, 5],
          [4, 5, 6, 7, 8],
          [7, 8, 9, 10, 11],
      ],
      "last_scored": [
          [],
          [],
          [],
          [3, 4, 5, 6, 7],
          [6, 7, 8, 9, 10],
          [9, 10, 11, 12, 13],
          [12, 13, 14, 15, 16],
      ],
  }
  for span, lists in want.items():
    got = []
    for b in data_windows.memory_eval_batches(np.arange(21), 8, 3, 3):
      end = np.asarray(
          evaluation.long_memory_end(b["start"], b["score_from"], span)
      )
      got += [
          list(range(max(e - 5, 0), e))
          for e, n in zip(end, b["score_count"])
          if n
      ]
    assert got == lists, span
  with pytest.raises(errors.ConfigError, match="long_mem_span"):
    evaluation.long_memory_end(0, 0, "window")


def test_cache_evaluation_matches_numpy(setup):
  model, params, tokens, one = setup
  grid = _grid("cache", long_sizes=(6,), thetas=(0.05,), lambdas=(0.0, 0.3))
  r = _score_stream(
      model,
      params,
      tokens,
      grid,
      window_len=WINDOW,
      score_len=SCORE,
      batch_size=3,
      mesh=one,
      block_size=None,
      keep_tokens=True,
  )
  ref = reference(model, params, tokens, "cache", 6, theta=0.05, lam=0.3)
  np.testing.assert_allclose(r["grid_logprob"][1], ref, rtol=2e-5, atol=2e-5)
  # lam = 0 is exactly the plain model.
  np.testing.assert_array_equal(r["grid_logprob"][0], r["lm_logprob"])


def test_long_memory_of_size_zero_equals_local_and_lambda_zero_equals_plain(
    setup,
):
  model, params, tokens, one = setup
  kw = dict(
      window_len=WINDOW,
      score_len=SCORE,
      batch_size=2,
      mesh=one,
      block_size=4,
  )
  both = _score_stream(
      model,
      params,
      tokens,
      _grid("trime", long_sizes=(0, 9), temperatures=(1.0,)),
      **kw,
  )
  local = _score_stream(
      model,
      params,
      tokens,
      _grid("trime", long_sizes=(0,), temperatures=(1.0,)),
      **kw,
  )
  assert both["grid"][0]["nll"] == pytest.approx(
      local["grid"][0]["nll"], rel=1e-6
  )
  assert both["grid"][1]["nll"] != pytest.approx(
      local["grid"][0]["nll"], rel=1e-3
  )
  # The plain scores and the lam = 0 cache equal memjax.eval.windows's protocol.
  plain = windows.WindowScorer(
      rows.Scoring(model, one),
      window_len=WINDOW,
      score_len=SCORE,
      batch_size=4,
  ).score(params, tokens)
  cache0 = _score_stream(
      model,
      params,
      tokens,
      _grid("cache", long_sizes=(9,), thetas=(0.1,), lambdas=(0.0,)),
      **kw,
  )
  assert cache0["grid"][0]["nll"] == pytest.approx(plain["nll"], rel=1e-6)
  assert cache0["plain"]["nll"] == pytest.approx(plain["nll"], rel=1e-6)
  assert cache0["grid"][0]["tokens"] == plain["tokens"] == len(tokens) - 1


def test_sharded_evaluation_equals_unsharded(setup):
  model, params, tokens, one = setup
  grid = _grid("trime", long_sizes=(0, 11), temperatures=(0.8, 1.3))
  kw = dict(window_len=WINDOW, score_len=SCORE, block_size=4)
  a = _score_stream(model, params, tokens, grid, batch_size=8, mesh=one, **kw)
  mesh = sharding_lib.make_mesh({"data": 8})
  b = _score_stream(model, params, tokens, grid, batch_size=8, mesh=mesh, **kw)
  for x, y in zip(a["grid"], b["grid"]):
    assert x["nll"] == pytest.approx(y["nll"], rel=1e-5)


def test_fifo_bank_keeps_exactly_the_last_pairs():
  bank = evaluation.init_bank(5, 2)
  push = jax.jit(evaluation.push)
  stream = np.arange(23)
  for lo in range(0, 23, 4):  # windows of 4 new pairs, the last one short
    pos = np.full(4, -1)
    chunk = stream[lo : lo + 4]
    pos[: len(chunk)] = chunk
    keys = np.stack([pos, -pos], 1).astype(np.float32)
    bank = push(
        bank, jnp.asarray(keys), jnp.asarray(pos + 100), jnp.asarray(pos)
    )
    last = stream[max(lo + len(chunk) - 5, 0) : lo + len(chunk)]
    got = np.asarray(bank.positions)
    np.testing.assert_array_equal(got[got >= 0], last)
    assert np.all(got[: 5 - len(last)] == -1)
    np.testing.assert_array_equal(np.asarray(bank.tokens)[got >= 0], last + 100)
    np.testing.assert_array_equal(np.asarray(bank.keys)[got >= 0, 0], last)
  trime = build.parts().eval_memories.get("trime")
  assert evaluation.bank_capacity(trime, (0, 100, 50), 8, 3) == 105
  assert evaluation.bank_capacity(trime, (0,), 8, 3) == 0
