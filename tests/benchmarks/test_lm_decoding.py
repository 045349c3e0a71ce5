"""benchmarks/lm_decoding.py at a tiny size: both methods time a batch and
the report gives each one's new tokens/s against the sampler's."""

import json
import subprocess
import sys

from tests.conftest import REPO


def _report(flags: str, tmp_path) -> dict:
  """Runs the benchmark with ``flags`` and returns its JSON report."""
  out = tmp_path / "report.json"
  proc = subprocess.run(
      [sys.executable, "benchmarks/lm_decoding.py", *flags.split()]
      + [f"--out={out}"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text())


def test_the_benchmark_reports_both_methods_and_their_ratios(tmp_path):
  flags = "--prompt=10 --new=4 --d_model=32 --layers=1 --heads=2 --kv_heads=1"
  flags += " --d_ff=64 --vocab=64 --batches=1,2 --rounds=1"
  report = _report(flags, tmp_path)
  names = [r["name"] for r in report["results"]]
  assert names == [
      "sampler batch 1",
      "cached batch 1",
      "sampler batch 2",
      "cached batch 2",
  ]
  assert all(r["new_tokens_per_s"] > 0 for r in report["results"])
  assert report["results"][0]["vs_baseline"]["new_tokens_per_s"] == 1.0
  assert report["machine"]["cpu_count"] >= 1 and report["new_tokens"] == 4


def test_a_paper_configs_model(tmp_path):
  """``--config``: the config's model (here TRIME's smoke LM, adaptive
  softmax and all) decodes both ways, and the report names it."""
  flags = "--config=configs/trime_wt103.py:trime_smoke --prompt=10 --new=4"
  report = _report(flags + " --batches=2 --rounds=1", tmp_path)
  assert report["model"] == "configs/trime_wt103.py:trime_smoke"
  assert [r["name"] for r in report["results"]] == [
      "sampler batch 2",
      "cached batch 2",
  ]
  assert all(r["new_tokens_per_s"] > 0 for r in report["results"])
