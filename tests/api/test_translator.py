"""memjax.load on a translation run: translate and score, compiled once per
length bucket."""

import os

import numpy as np
import pytest

import memjax
from memjax.api import translator as translator_api
from memjax.tasks.translation import decoding
from tests.conftest import REPO


def _pairs(n: int) -> tuple[list[str], list[str]]:
  with open(os.path.join(REPO, "demo_data", "mt_de_en", "test.de")) as f:
    de = f.read().splitlines()
  with open(os.path.join(REPO, "demo_data", "mt_de_en", "test.en")) as f:
    en = f.read().splitlines()
  keep = [i for i, s in enumerate(de) if 3 <= len(s.split()) <= 6][:n]
  return [de[i] for i in keep], [en[i] for i in keep]


@pytest.fixture(scope="module")
def mt(mt_smoke_workdir):
  return memjax.load(mt_smoke_workdir)


def _bucket_of(mt, sentence):
  return decoding.source_bucket(len(mt.vocab.encode(sentence)) + 1)  # + EOS


def test_translating_one_at_a_time_compiles_once_per_bucket(
    mt, count_lowerings
):
  assert isinstance(mt, translator_api.Translator)
  source, _ = _pairs(40)
  source = [s for s in source if _bucket_of(mt, s) == 16][:6]
  assert len(source) == 6
  with count_lowerings() as lowered:
    one_by_one = [mt.translate([s], beam=2)[0] for s in source]
  assert 1 <= lowered() <= 1  # Six calls, one source bucket: one program.
  with count_lowerings() as lowered:
    together = mt.translate(source, beam=2)
  assert lowered() == 0
  assert together == one_by_one  # A sentence's translation is its own.
  assert all(isinstance(t, str) for t in together)


def test_score_is_the_sum_of_teacher_forced_logprobs(mt, count_lowerings):
  source, target = _pairs(6)
  with count_lowerings() as lowered:
    r = mt.score(source, target)
    again = mt.score(target, source)
  # Each call is one batch of six pairs: at most one program each.
  assert 1 <= lowered() <= 2 and np.isfinite(again["nll"])
  assert [len(lp) for lp in r["logprobs"]] == [
      len(mt.vocab.encode(t)) + 1 for t in target
  ]
  assert all(np.all(lp <= 0) for lp in r["logprobs"])
  np.testing.assert_allclose(
      r["sentence_logprob"], [np.sum(lp) for lp in r["logprobs"]], rtol=1e-6
  )
  assert r["ppl"] == pytest.approx(np.exp(r["nll"]))
  # A pair scored alone or among others: the same log-probabilities.
  alone = mt.score(source[2:3], target[2:3])
  np.testing.assert_allclose(
      alone["logprobs"][0], r["logprobs"][2], rtol=1e-5, atol=1e-5
  )
  # The right target is likelier than another sentence's, on average.
  wrong = mt.score(source, target[1:] + target[:1])
  assert r["nll"] < wrong["nll"]
  with pytest.raises(ValueError, match="6 sources but 5 targets"):
    mt.score(source, target[:5])


def test_hypotheses_are_the_beams_best_first(mt):
  source, _ = _pairs(1)
  hyps = mt.hypotheses(source[0], beam=3)
  assert 1 <= len(hyps) <= 3
  scores = [s for _, s in hyps]
  assert scores == sorted(scores, reverse=True)
  assert hyps[0][0] == mt.translate(source[:1], beam=3)[0]
