"""``scorer_for(run)``: which scorer a run gets, and the run's memory setting;
the kinds agree with each other where their protocols coincide."""

import json

import jax
import numpy as np
import pytest

from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax import sharding as sharding_lib
from memjax.eval import memory_grid
from memjax.eval import scorer as scorer_lib
from memjax.eval import streams
from memjax.eval import windows
from memjax.models import transformer
from tests.conftest import set_memory
from tests.models import helpers


def _run(attention="vanilla", mem_len=0, path="", memory=None):
  """(scoring, params) of a one-layer model of ``attention``, its settings
  the base config's with small windows and the ``eval_memory`` keys of
  ``memory``, its parameters from ``path``."""
  c = config_lib.base_config()
  c.eval.update(dict(window_len=8, score_len=4, batch_size=2, segment_len=4))
  c.eval_memory.batch_size, c.eval_memory.block_size = 2, 4
  set_memory(c, **(memory or {}))
  c.model.attention, c.model.mem_len = attention, mem_len
  run = build.build(c, path or "/nonexistent/run")
  model = transformer.TransformerLM(
      cfg=helpers.tiny(
          20,
          mem_len=mem_len,
          attention=attention,
      )
  )
  x = np.zeros((1, 4), np.int32)
  params = model.init(jax.random.key(0), x, x)["params"]
  mesh = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  return run.scoring(model, mesh=mesh, path=path), params


def test_the_choice_follows_the_model_and_the_memory():
  plain, _ = _run()
  xl, _ = _run("xl", 8)
  assert type(scorer_lib.scorer_for(plain)) is windows.WindowScorer
  assert type(scorer_lib.scorer_for(plain, {"kind": "none"})) is (
      windows.WindowScorer
  )
  memory = scorer_lib.scorer_for(plain, {"kind": "trime", "temperature": 2.0})
  assert type(memory) is memory_grid.MemoryScorer
  assert memory.grid.values() == {"temperatures": (2.0,)}
  assert type(scorer_lib.scorer_for(xl)) is streams.StreamScorer
  with pytest.raises(errors.ConfigError, match="carries its own memory"):
    scorer_lib.scorer_for(xl, {"kind": "cache"})


def test_a_document_scores_alike_through_windows_and_a_memory_without_one():
  # The cache at lambda 0 is the plain model on the same windows: the
  # memory grid's scores of each document equal the windowed scorer's.
  run, params = _run()
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 20, 40).astype(np.int32)
  spans = np.array([[0, 13], [13, 40]])
  plain = scorer_lib.scorer_for(run).document_logprobs(params, tokens, spans)
  cache0 = scorer_lib.scorer_for(
      run, {"kind": "cache", "cache_lambda": 0.0, "cache_theta": 0.1}
  ).document_logprobs(params, tokens, spans)
  assert [len(x) for x in plain] == [12, 26]
  for a, b in zip(plain, cache0):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  stream = scorer_lib.scorer_for(run).stream_logprobs(params, tokens[13:])
  np.testing.assert_allclose(stream, plain[1], rtol=1e-6)


def test_a_stream_scores_alike_by_lanes_and_as_one_document():
  run, params = _run("xl", 16)
  rng = np.random.default_rng(1)
  tokens = rng.integers(1, 20, 15).astype(np.int32)
  scorer = scorer_lib.scorer_for(run)
  whole = scorer.stream_logprobs(params, tokens)
  doc = scorer.document_logprobs(params, tokens, np.array([[0, 15]]))[0]
  np.testing.assert_allclose(whole, doc, rtol=1e-6)
  res = scorer.score(params, tokens)
  assert res["nll"] == pytest.approx(-whole.mean(), rel=1e-5)


def test_memory_setting_prefers_tune_json(tmp_path):
  plain, _ = _run(path=str(tmp_path))
  assert scorer_lib.memory_setting(plain) == {"kind": "none"}
  trime = {"kind": "trime", "temperature": 1.5}
  configured, _ = _run(path=str(tmp_path), memory=trime)
  assert scorer_lib.memory_setting(configured) == {
      "kind": "trime",
      "long_mem_tokens": 0,
      "temperature": 1.5,
      "source": "config",
  }
  with open(tmp_path / "tune.json", "w") as f:
    json.dump({"kind": "cache", "best": {"cache_theta": 0.2}}, f)
  assert scorer_lib.memory_setting(configured) == {
      "kind": "cache",
      "cache_theta": 0.2,
      "source": "tune.json",
  }
  xl, _ = _run("xl", 8, path=str(tmp_path), memory=trime)
  assert scorer_lib.memory_setting(xl) == {"kind": "none"}
