"""--mode=generate on an imported decoder LM: key/value-cache decoding,
token for token the argmax of the full forward pass; a file of prompts decoded
in batches, each row what its prompt gives alone; bad input in one line."""

import json
import os
import shutil

import numpy as np
import pytest

import memjax
from memjax.models import variables as model_vars
from memjax.modes import generate as generate_lib
from tests.conftest import REPO
from tests.conftest import run_main

FIXTURE = os.path.join(REPO, "tests", "fixtures", "pretrained", "llama_gqa")
PROMPTS = ["the dog sat", "on the mat . the", "a"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """(workdir, corpus dir) of llama_gqa imported, and a small text corpus."""
  root = tmp_path_factory.mktemp("generate")
  workdir = str(root / "llama_gqa")
  proc = run_main(
      "--config=configs/pretrained.py:import",
      f"--workdir={workdir}",
      f"--config.pretrained.path={FIXTURE}",
      "--mode=import",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  data = root / "text"
  data.mkdir()
  for split in ("train", "valid", "test"):
    (data / f"{split}.txt").write_text("the dog sat on the mat . " * 8)
  return workdir, str(data)


def _generate(imported, *flags):
  workdir, data = imported
  return run_main(
      "--config=configs/pretrained.py:import",
      f"--workdir={workdir}",
      "--config.data.corpus=text",
      f"--config.data.data_dir={data}",
      *flags,
      "--mode=generate",
  )


def test_generate_mode_decodes_with_a_cache_as_the_model_scores(imported):
  proc = _generate(
      imported,
      "--config.generate.prompt_len=6",
      "--config.generate.num_tokens=9",
      "--config.generate.top_p=1e-6",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "key/value cache" in proc.stdout + proc.stderr
  workdir = imported[0]
  with open(os.path.join(workdir, "generation.json"), encoding="utf-8") as f:
    out = json.load(f)
  assert len(out["prompt_ids"]) == 6 and len(out["ids"]) == 9
  # A nucleus of one token: each token the argmax of the full forward
  # pass over the prompt and the tokens before it.
  lm = memjax.load(workdir)
  seq = np.asarray([out["prompt_ids"] + out["ids"]], np.int32)

  def fn(mdl, x):
    return mdl.log_probs(mdl(x, None, None, deterministic=True).hidden)

  variables = model_vars.as_variables(lm.restored.variables)
  lp = np.asarray(lm.restored.model.apply(variables, seq, method=fn))[0]
  np.testing.assert_array_equal(out["ids"], lp[5:-1].argmax(-1))


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_a_file_of_prompts_is_decoded_in_batches(imported, tmp_path, suffix):
  prompts = tmp_path / f"prompts{suffix}"
  if suffix == ".jsonl":
    lines = [json.dumps({"prompt": p, "id": i}) for i, p in enumerate(PROMPTS)]
  else:
    lines = PROMPTS[:2] + [""] + PROMPTS[2:]  # A blank line is skipped.
  prompts.write_text("\n".join(lines) + "\n")
  proc = _generate(
      imported,
      f"--config.generate.prompts={prompts}",
      "--config.generate.num_tokens=5",
      "--config.generate.greedy=True",
      "--config.generate.batch_size=2",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  workdir = imported[0]
  path = os.path.join(workdir, "generations.jsonl")
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  assert [r["prompt"] for r in rows] == PROMPTS
  assert [r["index"] for r in rows] == [0, 1, 2]
  lm = memjax.load(workdir)
  for row in rows:
    # Each row: what its prompt gives alone, greedy, through the API.
    ids = generate_lib.encode_prompt(lm.vocab, row["prompt"])
    alone = lm.generate(ids, 5, greedy=True)
    assert row["ids"] == alone.tolist()
    assert row["prompt_ids"] == ids.tolist()
    assert row["continuation"] == lm.generate(row["prompt"], 5, greedy=True)
    assert row["stop"] == ("eos" if len(alone) < 5 else "length")


@pytest.mark.parametrize(
    "flag,needle",
    [
        ("--config.generate.prompts={missing}", "generate.prompts: no file"),
        ("--config.generate.prompts={bad}", "line 2 of"),
        ("--config.generate.top_p=0.0", "generate.top_p must be in (0, 1]"),
        ("--config.generate.top_k=-1", "generate.top_k must be >= 0"),
        ("--config.generate.memory=True", "this run has no evaluation memory"),
    ],
)
def test_bad_generate_settings_are_one_line_with_exit_2(
    imported, tmp_path, flag, needle
):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "the dog"}\n["not", "an", "object"]\n')
  flag = flag.format(missing=tmp_path / "nope.txt", bad=bad)
  before = sorted(os.listdir(imported[0]))
  proc = _generate(imported, flag)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert needle in proc.stderr
  assert "Traceback" not in proc.stderr
  assert sorted(os.listdir(imported[0])) == before  # Nothing written.


def test_a_marge_run_generates_through_main(marge_smoke_workdir, tmp_path):
  """MARGE through python -m memjax.main --mode=generate: its windows
  retrieve their sources from the run's index, row for row what
  ``lm.generate`` gives."""
  workdir = str(tmp_path / "marge")
  shutil.copytree(marge_smoke_workdir, workdir)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("the cat\nin 1990 the team\n")
  proc = run_main(
      "--config=configs/marge_wt103.py:smoke",
      f"--workdir={workdir}",
      f"--config.generate.prompts={prompts}",
      "--config.generate.num_tokens=20",
      "--config.generate.greedy=True",
      "--mode=generate",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, "generations.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  lm = memjax.load(workdir)
  want = lm.generate(["the cat", "in 1990 the team"], 20, greedy=True)
  assert [r["continuation"] for r in rows] == want
  assert all(len(r["ids"]) == 20 for r in rows)
