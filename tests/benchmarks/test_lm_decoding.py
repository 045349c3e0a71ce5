"""benchmarks/lm_decoding.py at a tiny size: both methods time a batch and
the report gives each one's new tokens/s against the recomputing
baseline's."""

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
      "recompute batch 1",
      "cached batch 1",
      "recompute batch 2",
      "cached batch 2",
  ]
  assert all(r["new_tokens_per_s"] > 0 for r in report["results"])
  assert report["results"][0]["vs_baseline"]["new_tokens_per_s"] == 1.0
  assert report["machine"]["cpu_count"] >= 1 and report["new_tokens"] == 4


def test_a_paper_configs_model(tmp_path):
  """``--config``: the config's model (here TRIME's smoke LM, adaptive
  softmax and all) decodes both ways, and the report names it."""
  flags = "--config=configs/trime_wt103.py:trime_smoke --prompt=10 --new=4"
  flags += " --batches=1,2 --baseline_batches=1 --rounds=1"
  report = _report(flags, tmp_path)
  assert report["model"] == "configs/trime_wt103.py:trime_smoke"
  assert [r["name"] for r in report["results"]] == [
      "recompute batch 1",
      "cached batch 1",
      "cached batch 2",
  ]
  assert all(r["new_tokens_per_s"] > 0 for r in report["results"])


def test_a_recurrent_configs_model_decodes_with_its_own_decoder(tmp_path):
  """``--config`` of LaMemo: its decoder by segments, no recomputing
  baseline (it would drop the memory)."""
  flags = "--config=configs/lamemo_wt103.py:smoke --prompt=20 --new=4"
  flags += " --batches=1,2 --rounds=1"
  report = _report(flags, tmp_path)
  assert [r["name"] for r in report["results"]] == [
      "cached batch 1",
      "cached batch 2",
  ]
  assert all(r["new_tokens_per_s"] > 0 for r in report["results"])


def test_a_runs_decoding_with_and_without_its_datastore(
    smoke_workdir, tmp_path
):
  """``--workdir`` with ``--datastore``: the smoke run decodes without and
  with kNN-LM over a datastore of its features; the report gives the
  search's queries and milliseconds per query."""
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax.methods.external import modes as external_modes  # pylint: disable=g-import-not-at-top

  c = trime_wt103.get_config("smoke")
  c.train.init_from = smoke_workdir
  c.datastore.max_windows = 8
  c.eval_memory.kind = "knn"
  store = external_modes.datastore(build.build(c, str(tmp_path / "ext")))
  memory = '{"kind":"knn","knn_temperature":1.0,"knn_lambda":0.25}'
  flags = f"--workdir={smoke_workdir} --datastore={store['path']}"
  flags += f" --memory={memory} --ext_k=8 --search=exact"
  flags += " --prompt=6 --new=4 --batches=2 --rounds=1"
  report = _report(flags, tmp_path)
  assert [r["name"] for r in report["results"]] == [
      "cached batch 2",
      "cached + knn batch 2",
  ]
  assert report["memory"]["kind"] == "knn"
  # Two rows, a warm-up and a pass of 4 tokens each: one query per row
  # at the prefill and at each step.
  assert report["search_queries"] == 2 * (5 + 5)
  assert report["search_ms_per_query"] > 0
