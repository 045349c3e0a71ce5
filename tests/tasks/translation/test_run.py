"""A smoke translation run end to end through ``memjax.main --mode=train``
(the common loop with the translation task), translating a file, and the one-line error for
parallel files that disagree."""

import json
import os

import pytest

from memjax import errors
from memjax.data import parallel
from memjax.modes import translation
from memjax import train


@pytest.fixture(scope="module")
def mt_run(mt_smoke_workdir):
  """The session's 4-step smoke run on the first 300 pairs of each split
  (``tests/conftest.py``), its data directory and results."""
  data = os.path.join(os.path.dirname(mt_smoke_workdir), "mt_data")
  with open(os.path.join(mt_smoke_workdir, "results.json")) as f:
    return mt_smoke_workdir, data, json.load(f)


def test_training_scores_valid_with_sacrebleu(mt_run):
  workdir, _, results = mt_run
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["step"] == 4 and saved["valid"]["sentences"] == 16
  assert "tok:13a" in saved["valid"]["bleu_signature"]
  with open(os.path.join(workdir, "translations", "valid.txt")) as f:
    assert len(f.read().splitlines()) == 16
  assert 0.0 <= results["valid"]["bleu"] <= 100.0
  # The common loop's files: config, vocabulary, TensorBoard events, log.
  with open(os.path.join(workdir, "vocab.json")) as f:
    assert json.load(f)["kind"] == "sentencepiece"
  assert any(n.startswith("events.out") for n in os.listdir(workdir))
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    assert [json.loads(l)["step"] for l in f] == [1, 2, 3, 4]


def test_translate_a_file(mt_run, mt_smoke_config, tmp_path):
  workdir, data, _ = mt_run
  src = tmp_path / "in.de"
  src.write_text("Klicken Sie auf OK.\nDas Haus ist groß.\n", encoding="utf-8")
  out = tmp_path / "out.en"
  c = mt_smoke_config(data, input_file=str(src), output_file=str(out))
  results = translation.translate(c, workdir)
  assert results["sentences"] == 2
  assert len(out.read_text(encoding="utf-8").splitlines()) == 2


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
    train.train_and_evaluate(mt_smoke_config(str(data)), str(workdir))
  assert isinstance(e.value, errors.UserError) and "\n" not in str(e.value)
  assert not workdir.exists()
