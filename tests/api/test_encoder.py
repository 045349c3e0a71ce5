"""memjax.load on BERT-style encoders: a masked LM with product-key memory
(trained here through the public memjax.train) and a fine-tuned ResM
classifier."""

import os

import numpy as np
import pytest

import memjax
from memjax.api import encoder as encoder_api
from tests import shared_runs

TEXTS = [
    "the game was released in japan in 1998 .",
    "the river flows into the sea near the city .",
    "he was born in london and studied music .",
    "the team won the cup in the final season .",
    "she wrote three novels and a play .",
]
REVIEWS = [
    "a fine , warm and funny film .",
    "dull , long and badly acted .",
    "one of the best films of the year .",
    "a horrible , boring mess .",
]


@pytest.fixture(scope="module")
def pkm_mlm(bert_mlm_smoke_workdir, tmp_path_factory):
  """A 2-step PKM masked LM trained with memjax.train on the tiny corpus."""
  corpus = os.path.join(
      os.path.dirname(bert_mlm_smoke_workdir), "bert_tiny_wiki"
  )
  config = shared_runs.bert_smoke_config("pkm_smoke", corpus)
  workdir = str(tmp_path_factory.mktemp("api") / "pkm_mlm")
  results = memjax.train(config, workdir)
  assert np.isfinite(results["valid"]["ppl"])
  with pytest.raises(memjax.errors.WorkdirError):
    memjax.train(config, os.path.join(workdir, "config.json"))  # a file
  return memjax.load(workdir)


def test_masked_lm_scores_masked_tokens_compiled_once(pkm_mlm, count_lowerings):
  assert isinstance(pkm_mlm, encoder_api.MaskedLM)
  with count_lowerings() as lowered:
    alone = [pkm_mlm.score([t], seed=3) for t in TEXTS[:1]]
    first = lowered()
    one_by_one = [pkm_mlm.score([t])["logprobs"][0] for t in TEXTS]
  assert first >= 1 and lowered() == first  # Five calls: nothing new.
  together = pkm_mlm.score(TEXTS)
  for a, b in zip(one_by_one, together["logprobs"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # The masked positions are ordinary pieces, never [CLS] (position 0).
  positions = together["positions"]
  assert all(len(p) and p.min() >= 1 for p in positions)
  assert together["tokens"] == sum(len(p) for p in positions)
  flat = np.concatenate(together["logprobs"])
  assert together["nll"] == pytest.approx(-flat.mean(), rel=1e-5)
  assert np.all(flat <= 0) and alone[0]["tokens"] >= 1
  # mask_prob = 1: every ordinary piece is chosen.
  full = pkm_mlm.score(TEXTS[:1], mask_prob=1.0)
  assert full["tokens"] == len(pkm_mlm.encode(TEXTS[0])) - 1


def test_masked_lm_usage_reports_each_memory_layer(pkm_mlm):
  usage = pkm_mlm.usage(TEXTS)
  layers = usage["memory"]
  assert layers and all(0 < m["mu"] <= 1 for m in layers.values())
  assert all(m["top1_mu"] <= m["mu"] for m in layers.values())


@pytest.fixture(scope="module")
def classifier(bert_cls_smoke_workdir):
  return memjax.load(bert_cls_smoke_workdir)


def test_classifier_is_the_best_dev_parameters(
    classifier, bert_cls_smoke_workdir
):
  assert isinstance(classifier, encoder_api.Classifier)
  assert classifier.restored.path == os.path.join(
      bert_cls_smoke_workdir, "best_dev"
  )
  last = memjax.load(bert_cls_smoke_workdir, step=2)
  assert last.restored.path == bert_cls_smoke_workdir


def test_classifier_predicts_labels_and_probabilities(
    classifier, count_lowerings
):
  with count_lowerings() as lowered:
    one_by_one = [classifier.predict([r]) for r in REVIEWS]
  assert lowered() <= 1  # One length bucket: one program.
  out = classifier.predict(REVIEWS)
  assert out["probabilities"].shape == (4, len(classifier.labels))
  np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1, rtol=1e-5)
  best = np.argmax(out["probabilities"], axis=1)
  assert out["labels"] == [classifier.labels[i] for i in best]
  for i, alone in enumerate(one_by_one):
    np.testing.assert_allclose(
        alone["probabilities"][0], out["probabilities"][i], rtol=1e-5
    )


def test_classifier_usage_by_class(classifier):
  usage = classifier.usage(REVIEWS, labels=["1", "0", "1", "0"])
  assert usage["memory"] and set(usage["class_divergence"])
  by_class = usage["by_class"]
  assert set(by_class) == {"0", "1"}
  # A class's usage is the usage over its sentences alone.
  positive = classifier.usage([REVIEWS[0], REVIEWS[2]], labels=["1", "1"])
  assert set(positive["by_class"]) == {"1"}
  assert by_class["1"]["memory"] == positive["memory"]
  for layer, m in usage["memory"].items():  # All reads: at least a class's.
    assert m["mu"] >= max(c["memory"][layer]["mu"] for c in by_class.values())
  # The per-slot sums behind the metrics: top-1 MU is the share of slots
  # some head picked first, the reads add up over the classes, and the
  # class divergence's IOU is sum(min) / sum(max) of the two top-1 counts.
  slots = usage["slot_sums"]
  assert set(slots) == {"0", "1"}
  for layer, m in usage["memory"].items():
    for name, c in by_class.items():
      top1 = slots[name]["memory"][layer]["top1"]
      assert top1.shape == (m["slots"],)
      assert c["memory"][layer]["top1_mu"] == pytest.approx(np.mean(top1 > 0))
    reads = sum(np.sum(s["memory"][layer]["reads"]) for s in slots.values())
    assert m["reads"] == pytest.approx(reads, rel=1e-6)
    pos, neg = (slots[n]["memory"][layer]["top1"] for n in ("1", "0"))
    iou = np.minimum(pos, neg).sum() / np.maximum(pos, neg).sum()
    assert usage["class_divergence"][layer]["iou"] == pytest.approx(iou)
  predicted = classifier.usage(REVIEWS)  # by the predicted labels
  assert predicted["memory"] == usage["memory"]  # same inputs, same usage
