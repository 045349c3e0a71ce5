"""The translation demo's floor: the copy-the-source baseline on a
hand-worked case and the check the trained model must pass (the trained
model itself is checked by ``make demo-mt``, too slow for the suite)."""

import pytest

from memjax.demos import mt as mt_demo


def test_copy_baseline_on_a_hand_worked_case():
  # Pair 1 is copied verbatim (product names), pair 2 shares no word. Both
  # sides have 8 tokens (brevity penalty 1); matching n-grams: 4/8 unigrams,
  # 3/6 bigrams, 2/4 trigrams, 1/2 4-grams, so BLEU = 100 * 0.5 = 50.
  source = ["Writer Calc Impress Draw", "Das Haus ist klein"]
  target = ["Writer Calc Impress Draw", "The house is small"]
  copy = mt_demo.copy_baseline(source, target)
  assert copy["bleu"] == pytest.approx(50.0)
  assert copy["sentences"] == 2
  assert mt_demo.copy_baseline(target, target)["bleu"] == pytest.approx(100.0)


def test_floor_is_twice_the_copy_bleu_and_above_its_chrf():
  copy = {"bleu": 3.22, "chrf": 21.27}
  assert mt_demo.floor(copy) == pytest.approx({"bleu": 6.44, "chrf": 21.27})
  line = mt_demo.check_floor({"bleu": 6.5, "chrf": 22.0}, copy)
  assert line.endswith(": cleared") and "6.44" in line
  for model in ({"bleu": 6.4, "chrf": 30.0}, {"bleu": 9.0, "chrf": 21.27}):
    with pytest.raises(mt_demo.BelowFloorError, match="NOT cleared") as e:
      mt_demo.check_floor(model, copy)
    assert "\n" not in str(e.value)
