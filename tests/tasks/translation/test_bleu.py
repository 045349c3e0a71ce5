"""sacreBLEU scoring: identical output scores 100; sacreBLEU's published
README example reproduces its published scores."""

import pytest

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
