"""The translation task inside the common loop: the periodic BLEU evaluation
that runs at ``train.eval_every`` steps, and resuming a run with other data
settings (one line, before anything is written)."""

import os

import pytest
import sacrebleu

from memjax import errors
from memjax import experiment
from memjax import task as task_lib
from memjax import train
from memjax.tasks.translation import parts


@pytest.fixture(scope="module")
def run(mt_smoke_workdir):
  data = os.path.join(os.path.dirname(mt_smoke_workdir), "mt_data")
  return mt_smoke_workdir, data


class _Writer:
  """Records what the evaluator logs (a clu metric writer's method)."""

  def __init__(self):
    self.scalars = {}

  def write_scalars(self, step, scalars):
    self.scalars[step] = dict(scalars)


def test_periodic_evaluation_scores_the_first_sentences(run, mt_smoke_config):
  workdir, data = run
  config = mt_smoke_config(data, beam_size=1)
  restored = experiment.load(workdir, config=config)
  task = task_lib.get(config)
  corpus = task.load(config, workdir, train=False)
  evaluator = task.evaluator(config, restored.model, None, corpus)
  writer = _Writer()
  res = evaluator.run(restored.params, 7, 8, "periodic_", writer)
  # Independently: greedy decoding of the first 8 valid sentences, scored
  # with sacreBLEU directly.
  split = corpus.splits["valid"]
  tr = parts.make_translator(
      config, restored.model, restored.params, restored.vocab
  )
  hyps = [tr.vocab.decode(x) for x in tr.translate_ids(split.source[:8], 1)]
  want = sacrebleu.corpus_bleu(hyps, [split.target_text[:8]]).score
  assert res["valid"]["sentences"] == 8
  assert res["valid"]["bleu"] == pytest.approx(want)
  assert set(writer.scalars) == {7}
  assert writer.scalars[7]["periodic_valid/bleu"] == pytest.approx(want)
  assert set(writer.scalars[7]) == {
      "periodic_valid/bleu",
      "periodic_valid/chrf",
      "periodic_valid/bleu_lowercase",
  }


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"max_tokens": 256}, "translation.max_tokens: 512 -> 256"),
        ({"buckets": (16, 32)}, "translation.buckets: [32] -> [16, 32]"),
        (
            {"source_lang": "en", "target_lang": "de"},
            "translation.source_lang: 'de' -> 'en'",
        ),
        ({"vocab_size": 400}, "translation.vocab_size: 300 -> 400"),
    ],
)
def test_resume_with_other_translation_data_stops(
    run, mt_smoke_config, overrides, named
):
  workdir, data = run
  before = {
      os.path.join(d, n): os.path.getmtime(os.path.join(d, n))
      for d, _, names in os.walk(workdir)
      for n in names
  }
  with pytest.raises(errors.ResumeError) as e:
    train.train_and_evaluate(mt_smoke_config(data, **overrides), workdir)
  message = str(e.value)
  assert isinstance(e.value, errors.UserError) and "\n" not in message
  assert named in message and "other data settings" in message
  after = {
      os.path.join(d, n): os.path.getmtime(os.path.join(d, n))
      for d, _, names in os.walk(workdir)
      for n in names
  }
  assert after == before


def test_resume_with_the_same_translation_data_passes_the_check(
    run, mt_smoke_config
):
  workdir, data = run
  train.check_resume(mt_smoke_config(data), workdir)  # Raises if it disagreed.
