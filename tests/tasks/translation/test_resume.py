"""The translation task inside the common loop: the periodic BLEU evaluation
that runs at ``train.eval_every`` steps, and resuming a run with other data
settings (one line, before anything is written)."""

import os

import jax
import numpy as np
import pytest
import sacrebleu

import memjax
from memjax import build
from memjax import dispatch
from memjax import errors
from memjax.run import loop
from memjax.run import position


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


def _greedy_by_teacher_forcing(model, params, sources, t) -> list[list[int]]:
  """Greedy translations (target ids before the first EOS or padding id) of
  ``sources`` in one batch: the argmax of the whole-prefix forward pass at
  each position.

  Sources are padded to the next power of two >= 8 of the longest, and
  ``t.max_len_a`` * that + ``t.max_len_b`` positions are decoded, the last
  an EOS.
  """
  longest = max(len(x) for x in sources)
  bucket = 8
  while bucket < longest:
    bucket *= 2
  max_len = int(t.max_len_a * bucket + t.max_len_b)
  src = np.zeros((len(sources), bucket), np.int32)
  for i, x in enumerate(sources):
    src[i, : len(x)] = x
  hidden = jax.jit(
      lambda p, inputs: model.apply(
          {"params": p}, inputs, None, True, src, method=model.forward
      ).hidden
  )
  table = np.asarray(params["target_embedding"], np.float64)  # Tied output.
  inputs = np.zeros((len(sources), max_len), np.int32)  # Start id 0.
  out = np.ones((len(sources), max_len), np.int32)  # EOS = 1 at the end.
  for pos in range(max_len - 1):
    h = np.asarray(hidden(params, inputs)[:, pos], np.float64)
    out[:, pos] = (h @ table.T).argmax(-1)
    inputs[:, pos + 1] = out[:, pos]
  # Each translation ends before its first EOS or padding id.
  return [list(row[: np.flatnonzero(row <= 1)[0]]) for row in out]


def test_periodic_evaluation_scores_the_first_sentences(run, mt_smoke_config):
  workdir, data = run
  config = mt_smoke_config(data, beam_size=1)
  restored = dispatch.restore(workdir, config=config)
  task = restored.run.task
  corpus = task.load(workdir, train=False)
  evaluator = task.evaluator(restored.run, restored.model, corpus)
  # After 4 steps the padding id 0 scores highest everywhere, so greedy
  # translations would all be empty: with a zero padding row of the tied
  # target table it scores 0 and other ids win.
  table = np.array(restored.params["target_embedding"])
  table[0] = 0.0
  params = {**restored.params, "target_embedding": jax.numpy.asarray(table)}
  writer = _Writer()
  res = evaluator.run(params, 7, 8, "periodic_", writer)
  # Independently: greedy decoding of the first 8 valid sentences written
  # out with the teacher-forced forward pass (not the translator), scored
  # with sacreBLEU directly.
  split = corpus.splits["valid"]
  ids = _greedy_by_teacher_forcing(
      restored.model, params, split.source[:8], config.translation
  )
  hyps = [restored.vocab.decode(x) for x in ids]
  assert sum(bool(h) for h in hyps) >= 4, hyps
  assert res["valid"]["chrf"] > 0
  want = sacrebleu.corpus_bleu(hyps, [split.target_text[:8]]).score
  assert sacrebleu.corpus_chrf(hyps, [split.target_text[:8]]).score == (
      pytest.approx(res["valid"]["chrf"])
  )
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
    memjax.train(mt_smoke_config(data, **overrides), workdir)
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
  run = build.build(mt_smoke_config(data), workdir)
  # What training checks first; raises if it disagreed.
  position.check_resume(loop.position(run, 0), workdir)
