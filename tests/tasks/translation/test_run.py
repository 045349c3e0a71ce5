"""A smoke translation run end to end through ``memjax.main --mode=train``
(the common loop with the translation task), translating a file, and the one-line error for
parallel files that disagree."""

import json
import os

import pytest
import sacrebleu

import memjax
from memjax import errors


@pytest.fixture(scope="module")
def mt_run(mt_smoke_workdir):
  """The session's 4-step smoke run on the first 300 pairs of each split
  (``tests/shared_runs.py``), its data directory and results."""
  data = os.path.join(os.path.dirname(mt_smoke_workdir), "mt_data")
  with open(os.path.join(mt_smoke_workdir, "results.json")) as f:
    return mt_smoke_workdir, data, json.load(f)


def test_training_scores_valid_with_sacrebleu(mt_run):
  workdir, data, results = mt_run
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["step"] == 4 and saved["valid"]["sentences"] == 16
  assert "tok:13a" in saved["valid"]["bleu_signature"]
  path = os.path.join(workdir, "translations", "valid.txt")
  with open(path, encoding="utf-8") as f:
    hyps = f.read().split("\n")
  assert len(hyps) == 17 and hyps[-1] == ""  # One line a valid sentence.
  with open(os.path.join(data, "valid.en"), encoding="utf-8") as f:
    refs = f.read().splitlines()[:16]
  # Independently: sacreBLEU's own corpus scores of the written file against
  # the first 16 references (chrF is above 0 after 4 steps; BLEU is not).
  bleu = sacrebleu.corpus_bleu(hyps[:16], [refs]).score
  chrf = sacrebleu.corpus_chrf(hyps[:16], [refs]).score
  assert chrf > 0
  for saved_or_returned in (saved, results):
    assert saved_or_returned["valid"]["bleu"] == pytest.approx(bleu)
    assert saved_or_returned["valid"]["chrf"] == pytest.approx(chrf)
  # The common loop's files: config, vocabulary, TensorBoard events, log.
  with open(os.path.join(workdir, "vocab.json")) as f:
    assert json.load(f)["kind"] == "sentencepiece"
  assert any(n.startswith("events.out") for n in os.listdir(workdir))
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    assert [json.loads(l)["step"] for l in f] == [1, 2, 3, 4]


def test_translate_a_file(mt_run, mt_smoke_config, tmp_path):
  """One output line a source line, in the source's order: the same three
  sentences in reverse order translate to the same lines reversed."""
  workdir, data, _ = mt_run
  lines = [
      "Er liest ein Buch über Häuser, und das Haus ist groß.",
      "OK.",
      "Das Haus ist groß.",
  ]  # Of different lengths: the translator sorts them by length.
  outs = []
  for name, order in (("forward", lines), ("reversed", lines[::-1])):
    src = tmp_path / f"{name}.de"
    src.write_text("\n".join(order) + "\n", encoding="utf-8")
    out = tmp_path / f"{name}.en"
    c = mt_smoke_config(data, input_file=str(src), output_file=str(out))
    assert memjax.run_mode("translate", c, workdir)["sentences"] == 3
    outs.append(out.read_text(encoding="utf-8").split("\n"))
  forward, backward = outs
  assert len(forward) == 4 and forward[-1] == ""  # 3 lines
  assert len(set(forward[:3])) == 3, forward  # Three different outputs.
  assert forward[:3] == backward[:3][::-1]


def test_misaligned_files_stop_before_anything_is_written(
    mt_smoke_config, tmp_path
):
  # memjax.main prints a UserError as one line and exits with status 2.
  data = tmp_path / "data"
  data.mkdir()
  for split in ("train", "valid"):
    (data / f"{split}.de").write_text("Hallo.\nWelt.\n")
    (data / f"{split}.en").write_text("Hello.\n")
  workdir = tmp_path / "run"
  with pytest.raises(errors.DataError, match="has 2 lines but") as e:
    memjax.train(mt_smoke_config(str(data)), str(workdir))
  assert isinstance(e.value, errors.UserError) and "\n" not in str(e.value)
  assert not workdir.exists()
