"""--mode=generate on an imported decoder LM: key/value-cache decoding,
token for token what the segment sampler draws."""

import json
import os

import numpy as np

import memjax
from memjax.modes import generate as generate_lib
from tests.conftest import REPO
from tests.conftest import run_main

FIXTURE = os.path.join(REPO, "tests", "fixtures", "pretrained", "llama_gqa")


def test_generate_mode_decodes_with_a_cache_as_the_sampler_does(tmp_path):
  workdir = str(tmp_path / "llama_gqa")
  flags = ("--config=configs/pretrained.py:import", f"--workdir={workdir}")
  proc = run_main(
      *flags, f"--config.pretrained.path={FIXTURE}", "--mode=import"
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  data = tmp_path / "text"
  data.mkdir()
  for split in ("train", "valid", "test"):
    (data / f"{split}.txt").write_text("the dog sat on the mat . " * 8)
  proc = run_main(
      *flags,
      "--config.data.corpus=text",
      f"--config.data.data_dir={data}",
      "--config.generate.prompt_len=6",
      "--config.generate.num_tokens=9",
      "--config.generate.top_p=1e-6",
      "--mode=generate",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "key/value cache" in proc.stdout + proc.stderr
  with open(os.path.join(workdir, "generation.json"), encoding="utf-8") as f:
    out = json.load(f)
  assert len(out["prompt_ids"]) == 6 and len(out["ids"]) == 9
  # The uncached sampler, a nucleus of one token: the same continuation.
  lm = memjax.load(workdir)
  sampler = generate_lib.Sampler(lm.restored.model, 32, top_p=1e-6)
  want = sampler.generate(lm.restored.variables, out["prompt_ids"], 9, 0)
  np.testing.assert_array_equal(out["ids"], want)
