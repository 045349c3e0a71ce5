"""The accelerator check: end to end on the CPU (--tiny), and its parts.

The end-to-end run starts ``benchmarks/accelerator_check.py`` as ``make
accelerator-check`` does (``PYTHONPATH`` the checkout, nothing installed),
with one CPU device and the suite's fast-compile XLA flags; its items and
plans run in their own processes, as on an accelerator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from benchmarks import accelerator_check
from benchmarks import accelerator_report as report_lib
from benchmarks import accelerator_runner as runner
from memjax.modes import platforms
from tests.conftest import COMPILE_FLAGS
from tests.conftest import REPO

TRAIN = [i.name for i in report_lib.ITEMS]
NAMES = list(report_lib.NAMES)


def check(out, *flags: str, timeout: float = 600):
  """Runs the check in a fresh process on one CPU device."""
  env = {
      k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))
  }
  env.update(PYTHONPATH=REPO, JAX_PLATFORMS="cpu", XLA_FLAGS=COMPILE_FLAGS)
  return subprocess.run(
      [sys.executable, "benchmarks/accelerator_check.py", f"--out={out}"]
      + list(flags),
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
  )


def read(out) -> tuple[dict, str]:
  with open(os.path.join(out, "accelerator_check.json")) as f:
    report = json.load(f)
  with open(os.path.join(out, "accelerator_check.md")) as f:
    return report, f.read()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  out = tmp_path_factory.mktemp("accelerator_check")
  proc = check(out, "--tiny", "--budget_s=600")
  assert proc.returncode == 0, proc.stderr[-4000:]
  report, md = read(out)
  return report, md, proc


def test_the_machine_and_every_row(tiny):
  report, _, proc = tiny
  m = report["machine"]
  assert (m["platform"], m["device_kind"], m["device_count"]) == (
      "cpu",
  ) * 2 + (1,)
  assert m["jax"] and m["jaxlib"] and m["flax"] and m["python"]
  assert report["plan_platform"] == "cpu" and report["tiny"]
  assert [r["name"] for r in report["rows"]] == NAMES
  assert sorted(NAMES) == sorted(TRAIN + ["knn"])
  assert all(r["status"] == "ok" for r in report["rows"]), report["rows"]
  assert "vanilla_7m: starting" in proc.stderr  # progress as it goes


def test_train_rows_are_measured_beside_their_plans(tiny):
  report, _, _ = tiny
  for row in report["rows"]:
    if row["kind"] != "train":
      continue
    m, plan = row["measured"], row["plan"]
    for key in (
        "compile_s",
        "step_s",
        "tokens_per_s",
        "xla_flops_per_step",
        "cost_analysis_flops_per_step",
        "model_flops_per_token",
        "mfu",
        "step_memory_bytes",
    ):
      assert m[key] > 0, (row["name"], key, m[key])
    assert m["tokens_per_s"] == pytest.approx(
        m["tokens_per_step"] / m["step_s"]
    )
    assert m["peak_bytes"] == "n/a"  # the CPU keeps no device statistics
    assert m["tokens_per_step"] == m["batch_size"] * m["seq_len"]
    # The plan compiled the same step: same tokens, same FLOPs by formula.
    assert plan["status"] == "ok", (row["name"], plan)
    assert plan["tokens_per_step"] == m["tokens_per_step"]
    assert plan["model_flops_per_token"] == pytest.approx(
        m["model_flops_per_token"]
    )
    assert plan["xla_flops_per_token"] == pytest.approx(
        m["xla_flops_per_step"] / m["tokens_per_step"], rel=0.02
    )
    with open(os.path.join(plan["workdir"], "plan.json")) as f:
      predicted = report_lib.predictions(json.load(f), m["dtype"])
    assert {k: plan[k] for k in predicted} == predicted
    peak = report_lib.peak_flops("cpu", m["dtype"])
    assert m["mfu"] == pytest.approx(
        m["model_flops_per_token"] * m["tokens_per_s"] / peak
    )
  knn = next(r for r in report["rows"] if r["name"] == "knn")["measured"]
  assert knn["exact_queries_per_s"] > 0 and knn["dim"] == 32  # trime_smoke's
  if knn["scann"] == "ok":
    assert knn["scann_queries_per_s"] > 0 and 0 < knn["recall_at_k"] <= 1
  else:
    assert knn["scann"] == "n/a: scann not installed"


def test_ratios_come_from_the_rows_own_step_times(tiny):
  report, _, _ = tiny
  rows = {r["name"]: r["measured"] for r in report["rows"]}
  assert [r["name"] for r in report["ratios"]] == [
      s.name for s in report_lib.RATIOS
  ]
  for r in report["ratios"]:
    of, over = rows[r["of"]], rows[r["over"]]
    assert r["step_time_ratio"] == pytest.approx(of["step_s"] / over["step_s"])
  lamemo = next(r for r in report["ratios"] if r["of"] == "lamemo_enwik8")
  xla = [rows[n]["xla_flops_per_step"] for n in ("lamemo_enwik8", "txl_enwik8")]
  assert lamemo["xla_flops_ratio"] == pytest.approx(xla[0] / xla[1])
  assert lamemo["xla_flops_ratio"] > 1  # the look-ahead costs FLOPs


def test_the_markdown_has_a_row_per_item(tiny):
  _, md, proc = tiny
  for name in NAMES:
    assert sum(l.startswith(f"| {name} |") for l in md.splitlines()) == 1, name
  for spec in report_lib.RATIOS:
    assert f"| {spec.name} (" in md
  assert "1x cpu (cpu" in md
  assert md.strip() in proc.stdout


def test_budget_zero_skips_every_item_and_writes_the_files(tmp_path):
  proc = check(tmp_path, "--tiny", "--budget_s=0", timeout=120)
  assert proc.returncode == 0, proc.stderr
  report, md = read(tmp_path)
  assert report["machine"] == {"status": "skipped: budget"}
  assert {r["status"] for r in report["rows"]} == {"skipped: budget"}
  for name in NAMES:
    assert f"| {name} |" in md and "skipped: budget" in md
  assert all(isinstance(r["step_time_ratio"], str) for r in report["ratios"])


def test_an_item_past_the_budget_is_stopped(tmp_path):
  proc = check(tmp_path, "--tiny", "--budget_s=4", "--items=vanilla_7m,knn")
  assert proc.returncode == 0, proc.stderr
  report, _ = read(tmp_path)
  status = {r["name"]: r["status"] for r in report["rows"]}
  first = status.pop("vanilla_7m")
  assert first.startswith("error: stopped at the budget") or first == (
      "skipped: budget"  # a machine so loaded that the probe took it all
  )
  assert status.pop("knn") == "skipped: budget"
  assert set(status.values()) == {"skipped: not selected"}
  assert report["elapsed_s"] < 30


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--items=nope"], "--items: unknown ['nope']"),
        (["--batch=nope=4"], "--batch 'nope=4'"),
        (["--set=model.no_such_key=1"], "unknown config key"),
        (["--platform=h900"], "plan.platform 'h900' is not known"),
        (["--budget_s=soon"], "--budget_s"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, flags, message):
  proc = check(tmp_path, "--tiny", *flags, timeout=120)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], lines
  assert not os.path.exists(tmp_path / "accelerator_check.json")


@pytest.mark.parametrize(
    "kind, platform",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("TPU v4", "tpu_v4"),
        ("TPU v5 lite", "tpu_v5e"),
        ("TPU v5e", "tpu_v5e"),
        ("TPU v5", "tpu_v5p"),
        ("TPU v5p", "tpu_v5p"),
        ("cpu", "cpu"),
        ("TPU v6 lite", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA B200", None),
    ],
)
def test_device_kinds_map_to_plan_platforms(kind, platform):
  assert report_lib.plan_platform(kind) == platform
  if platform is not None:
    assert platform in platforms.PLATFORMS


def fake_check(tmp_path, kind: str, budget_after: int, fail: str = ""):
  """A Check whose items 'run' in no time: the budget ends after
  ``budget_after`` worker calls, ``fail`` errs."""
  args = accelerator_check.parse_args(["--tiny", f"--out={tmp_path}"])
  planned = [accelerator_check.resolve(i, args) for i in report_lib.ITEMS]
  report = accelerator_check.new_report(planned, args)
  saves = []
  check_ = runner.Check(report, args, lambda: saves.append(1))
  calls = []

  def worker(name, spec):
    calls.append(name)
    if len(calls) == budget_after:
      check_.deadline = 0.0
    if name == "machine":
      return {"status": "ok", "machine": {"device_kind": kind}}
    if name == fail:
      return {"status": "error: RuntimeError: boom"}
    return {"status": "ok", "measured": {"step_s": 1.0, "kind": spec["kind"]}}

  check_.worker = worker
  items = [
      (p.item.name, accelerator_check.train_spec(p, args), p) for p in planned
  ]
  check_.run(items + [("knn", {"kind": "knn"}, None)])
  return report, calls, saves


def test_the_budget_is_checked_between_items(tmp_path):
  report, calls, saves = fake_check(tmp_path, "Fancy TPU", 3, fail="vanilla_7m")
  assert calls == ["machine", "vanilla_7m", "trime_7m"]
  status = [r["status"] for r in report["rows"]]
  assert status[:2] == ["error: RuntimeError: boom", "ok"]
  assert set(status[2:]) == {"skipped: budget"}
  assert len(saves) >= len(calls)  # saved after every item
  plan = {r["plan"]["status"] for r in report["rows"] if "plan" in r}
  assert plan == {"n/a: no platform entry for Fancy TPU"}


def test_ratios_say_why_they_are_missing():
  rows = [
      {"name": "trime_7m", "measured": {"step_s": 2.0, "tokens_per_step": 8}},
      {"name": "vanilla_7m", "measured": {"step_s": 1.0, "tokens_per_step": 8}},
      {"name": "trime_150m", "measured": {"step_s": 2.0, "tokens_per_step": 4}},
      {
          "name": "vanilla_150m",
          "measured": {"step_s": 1.0, "tokens_per_step": 8},
      },
      {"name": "txl_enwik8", "status": "skipped: budget"},
  ]
  got = {r["name"]: r for r in report_lib.ratios(rows)}
  assert got["trime_vs_vanilla_7m"]["step_time_ratio"] == 2.0
  assert got["trime_vs_vanilla_150m"]["step_time_ratio"].startswith(
      "n/a: batches differ"
  )
  lamemo = got["lamemo_vs_txl_enwik8"]
  assert lamemo["step_time_ratio"] == "n/a: lamemo_enwik8 has no step_s"
  assert lamemo["xla_flops_ratio"].startswith("n/a")
  md = report_lib.markdown(
      {"rows": [], "ratios": list(got.values()), "budget_s": 1.0}
  )
  assert "| trime_vs_vanilla_7m (trime_7m / vanilla_7m) | 2 |" in md


def test_missing_packages_are_named_in_one_line(monkeypatch):
  monkeypatch.setattr(
      runner.importlib.util,
      "find_spec",
      lambda name: None if name == "ml_collections" else types.ModuleType(name),
  )
  assert runner.missing_modules() == ["ml_collections"]
  assert "ml_collections-1.1.0-py3-none-any.whl" in runner.missing_line(
      ["ml_collections"]
  )


def test_out_of_memory_halves_the_batch(monkeypatch):
  from benchmarks import accelerator_measure as measure  # starts no device

  tried = []

  def train_once(spec, cfg):
    tried.append((cfg.data.batch_size, cfg.train.grad_accum))
    if cfg.data.batch_size > 60:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating")
    return {"batch_size": cfg.data.batch_size}

  monkeypatch.setattr(measure, "train_once", train_once)
  spec = {
      "name": "trime_150m",
      "config": "configs/trime_wt103.py:trime_150m",
      "overrides": ["train.grad_accum=4", "seed=1"],
      "max_halvings": 3,
  }
  out = measure.measure_train(spec)
  assert tried == [(240, 4), (120, 4), (60, 4)]
  assert out["measured"]["halvings"] == 2
  assert out["overrides"] == [
      "seed=1",
      "data.batch_size=60",
      "train.grad_accum=4",
  ]
  spec["max_halvings"] = 1
  with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
    measure.measure_train(spec)


def test_halving_keeps_whole_micro_batches_and_lanes():
  from benchmarks import accelerator_measure as measure  # starts no device

  def cfg(rows, accum, lane):
    return types.SimpleNamespace(
        data=types.SimpleNamespace(batch_size=rows, segments_per_lane=lane),
        train=types.SimpleNamespace(grad_accum=accum),
    )

  assert measure.halved(cfg(60, 4, 1), []) == [
      "data.batch_size=30",
      "train.grad_accum=1",
  ]
  assert measure.halved(cfg(16, 2, 4), ["data.batch_size=16"]) == [
      "data.batch_size=8",
      "train.grad_accum=2",
  ]
  assert measure.halved(cfg(4, 1, 4), []) is None  # below one lane


def test_synthetic_batches_have_the_declared_shapes():
  from benchmarks import accelerator_measure as measure  # starts no device

  shapes = {
      "inputs": ((4, 8), "int32"),
      "targets": ((4, 8), "int32"),
      "weights": ((4, 8), "float32"),
      "lane_id": ((4,), "int32"),
      "reset": ((2,), "bool"),
  }
  first, second = measure.synthetic_batches(shapes, 100, segments_per_lane=2)
  for key, (shape, dtype) in shapes.items():
    assert first[key].shape == shape and first[key].dtype == dtype, key
  assert 0 <= first["inputs"].min() and first["inputs"].max() < 100
  assert first["lane_id"].tolist() == [0, 0, 1, 1]
  assert first["reset"].all() and not second["reset"].any()
  assert set(np.unique(first["weights"])) <= {0.0, 1.0}
