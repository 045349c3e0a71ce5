"""sacreBLEU scoring: identical output scores 100; sacreBLEU's published
README example reproduces its published scores; the lowercased BLEU is
sacreBLEU's own 13a lowercased BLEU."""

import pytest
import sacrebleu

from memjax.tasks.translation import bleu


def test_identical_hypotheses_score_100():
  refs = ["Klicken Sie auf OK.", "The man bit the dog, twice!"]
  s = bleu.score(refs, refs)
  assert s["bleu"] == pytest.approx(100.0)
  assert s["bleu_lowercase"] == pytest.approx(100.0)
  assert s["chrf"] == pytest.approx(100.0)
  assert (
      "tok:13a" in s["bleu_signature"] and "case:mixed" in s["bleu_signature"]
  )
  assert "case:lc" in s["bleu_lowercase_signature"]


def test_published_test_vector():
  # The example of sacreBLEU's README (two reference streams), published as
  # "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ...)" and "chrF2 = 59.73".
  refs = [
      [
          "The dog bit the man.",
          "It was not unexpected.",
          "The man bit him first.",
      ],
      [
          "The dog had bit the man.",
          "No one was surprised.",
          "The man had bitten the dog.",
      ],
  ]
  hyps = [
      "The dog bit the man.",
      "It wasn't surprising.",
      "The man had just bitten him.",
  ]
  s = bleu.score(hyps, refs)
  assert round(s["bleu"], 2) == 48.53
  assert round(s["chrf"], 2) == 59.73


def test_case_matters_only_to_cased_bleu():
  s = bleu.score(["the cat sat on the mat ."], ["The Cat sat on the mat ."])
  assert s["bleu_lowercase"] == pytest.approx(100.0)
  assert s["bleu"] < 100.0


def test_lowercased_bleu_is_sacrebleus_13a_lowercased():
  # Pairs that differ in case and in the spacing of punctuation: the 13a
  # tokeniser splits "mat." into "mat ." and lowercasing folds the case, so a
  # change of tokeniser or of case handling moves the score.
  hyps = [
      "The Cat sat on the mat.",
      "Hello, World!",
      "It was NOT unexpected , he said.",
      "the dog bit the man first",
  ]
  refs = [
      "the cat sat on the mat .",
      "hello , world !",
      "It was not unexpected, he said .",
      "The dog had bitten the man first.",
  ]
  expected = sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score
  untokenised = sacrebleu.corpus_bleu(
      hyps, [refs], lowercase=True, tokenize="none"
  ).score
  assert abs(expected - untokenised) > 10.0  # the pairs tell them apart
  s = bleu.score(hyps, refs)
  assert s["bleu_lowercase"] == pytest.approx(expected)
  assert s["bleu"] < s["bleu_lowercase"]
