"""memjax.load on a decoder LM: scoring, batched generation, a datastore."""

import numpy as np
import pytest

import memjax
from configs import trime_wt103
from memjax import build
from memjax import errors
from memjax.api import lm as lm_api

TEXTS = [
    "the cat sat on the mat",
    "in 1990 the city of london was",
    "a b",
    "the history of the roman empire is long and the empire fell",
    "music is",
    "he said that the team won the game in the last minute",
]


@pytest.fixture(scope="module")
def model(smoke_workdir):
  return memjax.load(smoke_workdir)


def test_load_gives_a_language_model(model):
  assert isinstance(model, lm_api.LanguageModel)
  # The smoke config scores with the continuous cache (its eval_memory).
  assert model.memory["kind"] == "cache" and model.memory["source"] == "config"


def test_scoring_many_inputs_compiles_once(model, count_lowerings):
  with count_lowerings() as first:
    alone = model.score(TEXTS[0])
  assert first() >= 1  # The counter sees the scorer's program.
  with count_lowerings() as more:
    many = model.score(TEXTS)
  assert more() == 0  # Six inputs of other lengths: nothing new compiled.
  # Each input is its own stream: the batch gives each alone's scores.
  np.testing.assert_allclose(many["logprobs"][0], alone["logprobs"][0])
  assert [len(lp) for lp in many["logprobs"]] == [
      len(model.encode(t)) - 1 for t in TEXTS
  ]
  total = -sum(float(np.sum(lp, dtype=np.float64)) for lp in many["logprobs"])
  assert many["tokens"] == sum(len(lp) for lp in many["logprobs"])
  assert many["nll"] == pytest.approx(total / many["tokens"], rel=1e-6)
  assert all(np.all(lp <= 0) for lp in many["logprobs"])


def test_generate_takes_a_batch_of_prompts_and_compiles_once(
    model, count_lowerings
):
  # Key/value-cache decoding compiles once per batch size and cache length.
  prompts = ["the history of", "in 1990", "music is"]
  with count_lowerings() as first:
    out = model.generate(prompts, num_tokens=4, seed=0)
  with count_lowerings() as batch:
    again = model.generate(["a b", "the city of london", "x"], 4, seed=0)
  assert first() >= 1 and batch() == 0 and len(again) == 3
  assert isinstance(out, list) and len(out) == 3
  assert all(isinstance(t, str) and len(t.split()) == 4 for t in out)
  one = model.generate(prompts[1], num_tokens=4, seed=1)
  assert out[1] == one  # Prompt i draws with seed + i.
  ids = model.generate([model.encode("the history of")], num_tokens=5)
  assert ids[0].shape == (5,) and ids[0].dtype == np.int32


@pytest.mark.parametrize("text", ["", "word"])
def test_a_text_with_nothing_to_score_is_a_value_error(model, text):
  # '' has no token and 'word' one: its first token is context only.
  with pytest.raises(ValueError, match="nothing to score"):
    model.score(text)
  with pytest.raises(ValueError, match="input 1"):
    model.score(["the history of", text])


def test_generate_in_batches_gives_what_one_batch_gives(model):
  prompts = ["the history of", "in 1990", "music is"]
  whole = model.generate(prompts, num_tokens=4, greedy=True)
  assert model.generate(prompts, 4, greedy=True, batch_size=2) == whole
  with pytest.raises(errors.ConfigError, match="top_p must be"):
    model.generate(prompts, 4, top_p=0.0)


def _datastore_config(smoke_workdir):
  c = trime_wt103.get_config("smoke")
  c.train.init_from = smoke_workdir
  c.datastore.max_windows = 20
  c.datastore.shard_keys = 256
  c.eval_memory.kind = "knn"
  return c


def test_attach_scores_with_a_datastore(smoke_workdir, tmp_path):
  from memjax.methods.external import modes as external_modes  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / "ext")
  run = build.build(_datastore_config(smoke_workdir), workdir)
  out = external_modes.datastore(run)
  model = memjax.load(smoke_workdir)
  plain = model.score(TEXTS[:2], memory=False)
  setting = {
      "kind": "knn",
      "long_mem_tokens": 0,
      "knn_temperature": 1.0,
      "knn_lambda": 0.0,
  }
  with pytest.raises(memjax.errors.DataError, match="no datastore"):
    model.attach(str(tmp_path / "none"), setting)
  model.attach(out["path"], setting, search="exact", ext_k=8)
  assert model.memory["kind"] == "knn"
  # lambda = 0: the neighbours weigh nothing, the model alone.
  unmixed = model.score(TEXTS[:2])
  for a, b in zip(unmixed["logprobs"], plain["logprobs"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  mixed = model.attach(out["path"], {**setting, "knn_lambda": 0.5}).score(
      TEXTS[:2]
  )
  assert mixed["memory"]["knn_lambda"] == 0.5
  assert np.isfinite(mixed["nll"]) and mixed["nll"] != pytest.approx(
      plain["nll"], rel=1e-4
  )
  # The plain model is still there.
  assert model.score(TEXTS[:2], memory=False)["nll"] == pytest.approx(
      plain["nll"], rel=1e-6
  )


def test_a_marge_run_generates_with_its_retrieval(marge_smoke_workdir):
  """MARGE generates with the sources its windows retrieve
  (tests/methods/marge/test_decoding.py checks them against marge_eval);
  an evaluation memory besides them is refused in one line."""
  lm = memjax.load(marge_smoke_workdir)
  text = lm.generate("the cat", 20, greedy=True)
  assert isinstance(text, str) and len(text.split()) == 20
  assert lm.generate("the cat", 20, greedy=True) == text
  with pytest.raises(errors.ConfigError, match="MARGE reads its retrieved"):
    lm.generate(
        "the cat",
        2,
        memory={"kind": "cache", "cache_theta": 1, "cache_lambda": 0.1},
    )
