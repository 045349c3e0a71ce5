"""An imported model scores a raw-text corpus through its own tokenizer."""

import json
import os
import shutil

import numpy as np

import memjax
from memjax.data import sources
from tests.conftest import REPO
from tests.conftest import run_main


def test_eval_of_a_text_corpus_equals_scoring_its_text(imported_gpt2, tmp_path):
  workdir = str(tmp_path / "gpt2")
  shutil.copytree(imported_gpt2, workdir)
  data = tmp_path / "text"
  data.mkdir()
  raw = os.path.join(sources.default_data_dir("wikitext_raw"), "wiki.valid.raw")
  with open(raw, encoding="utf-8", newline="") as f:
    text = f.read()
  texts = {"train": text[:1500], "valid": text[1500:2700], "test": text[:900]}
  for split, t in texts.items():
    (data / f"{split}.txt").write_text(t, encoding="utf-8")
  # A config names no sizes: the imported model's come from its export.
  proc = run_main(
      "--config=configs/pretrained.py:import",
      "--config.data.corpus=text",
      f"--config.data.data_dir={data}",
      f"--workdir={workdir}",
      "--mode=eval",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    results = json.load(f)
  lm = memjax.load(workdir)
  for split in ("valid", "test"):
    want = lm.score(texts[split])
    assert results[split]["tokens"] == want["tokens"]
    np.testing.assert_allclose(results[split]["nll"], want["nll"], rtol=1e-6)
  assert results["unit"] == "ppl" and results["step"] == 0


def test_eval_scores_a_tokenizer_that_adds_bos_as_hugging_face(tmp_path):
  fixture = os.path.join(REPO, "tests", "fixtures", "pretrained", "llama_bos")
  expected = np.load(os.path.join(fixture, "expected.npz"))
  workdir = str(tmp_path / "llama_bos")
  proc = run_main(
      "--config=configs/pretrained.py:import",
      f"--config.pretrained.path={fixture}",
      f"--workdir={workdir}",
      "--mode=import",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  data = tmp_path / "text"
  data.mkdir()
  for split in ("train", "valid", "test"):
    (data / f"{split}.txt").write_text(str(expected["text"]), encoding="utf-8")
  # The split is one document, BOS first; windows of 8 tokens scoring 4
  # after the first begin with BOS: Hugging Face's rolling scores.
  window, score = (int(x) for x in expected["rolling"])
  proc = run_main(
      "--config=configs/pretrained.py:import",
      "--config.data.corpus=text",
      f"--config.data.data_dir={data}",
      f"--config.eval.window_len={window}",
      f"--config.eval.score_len={score}",
      f"--workdir={workdir}",
      "--mode=eval",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    results = json.load(f)
  want = expected["rolling_logprobs"].astype(np.float64)
  for split in ("valid", "test"):
    assert results[split]["tokens"] == len(want)
    np.testing.assert_allclose(results[split]["nll"], -want.mean(), rtol=1e-5)
