"""Compile time and memory of a config's train step, layers scanned or not.

Builds the train step that training runs (``memjax.modes.plan_compile``:
abstract state and batch, nothing allocated) on N fake CPU devices, once
with ``model.scan_layers=False`` (the baseline) and once with True, and
times its lowering and XLA's compilation in alternating rounds, with
XLA's memory analysis of each compiled program. The persistent
compilation cache is off, so every round compiles.

    python benchmarks/compile_time.py \\
        [--config=configs/trime_wt103.py:trime_247m] [--devices=8] \\
        [--rounds=2] [--set model.dtype=bfloat16] [--out=report.json]

Prints the JSON report (stdout) and a table of ratios (stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness  # pylint: disable=g-import-not-at-top

GIB = 2.0**30


def _step(config_path: str, overrides: list[str], devices: int, scan: bool):
  """The plan's train step of the config with ``model.scan_layers=scan``."""
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax.modes import plan_compile  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  cfg = harness.load_config(config_path, overrides)
  cfg.model.scan_layers = scan
  cfg.plan.devices = devices
  return plan_compile.build_step(build.build(cfg, ""), jax.devices())


def _time_compile(step: Any) -> dict[str, float]:
  """Seconds to lower and to compile the step, and its memory."""
  start = time.perf_counter()
  lowered = step.make_fn().lower(*step.args)
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  done = time.perf_counter()
  memory = compiled.memory_analysis()
  return {
      "lower_s": lowered_at - start,
      "compile_s": done - lowered_at,
      "temp_gib": memory.temp_size_in_bytes / GIB,
      "total_gib": (
          memory.argument_size_in_bytes
          + memory.output_size_in_bytes
          + memory.temp_size_in_bytes
          - memory.alias_size_in_bytes
      )
      / GIB,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument(
      "--config",
      default="configs/trime_wt103.py:trime_247m",
      help="the config file and variant",
  )
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument(
      "--set",
      action="append",
      default=[],
      metavar="KEY=VALUE",
      help=harness.SET_HELP,
  )
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "")
      + f" --xla_force_host_platform_device_count={args.devices}"
  )
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_enable_compilation_cache", False)
  steps = {
      name: _step(args.config, args.set, args.devices, scan)
      for name, scan in (("unscanned", False), ("scanned", True))
  }
  rounds: dict[str, list[dict[str, float]]] = {name: [] for name in steps}
  for r in range(args.rounds):
    for name, step in steps.items():
      rounds[name].append(_time_compile(step))
    harness.log(
        f"round {r + 1}/{args.rounds}: "
        + ", ".join(
            f"{n} lower {v[-1]['lower_s']:.1f} s compile "
            f"{v[-1]['compile_s']:.1f} s"
            for n, v in rounds.items()
        )
    )
  results = []
  for name, runs in rounds.items():
    row: dict[str, Any] = {"name": name}
    for key in ("lower_s", "compile_s"):
      row[key] = statistics.median(x[key] for x in runs)
      row[f"{key}_all_rounds"] = [x[key] for x in runs]
    row.update(temp_gib=runs[0]["temp_gib"], total_gib=runs[0]["total_gib"])
    row["num_params"] = steps[name].num_params
    results.append(row)
  keys = ("lower_s", "compile_s", "temp_gib", "total_gib")
  for r, ratio in zip(results, harness.ratios(results, keys)):
    r["vs_baseline"] = ratio
  report = {
      "machine": harness.machine(),
      "config": args.config,
      "devices": args.devices,
      "overrides": list(args.set),
      "statistic": "median round; the two steps alternate within each",
      "baseline": "unscanned",
      "results": results,
  }
  text = json.dumps(report, indent=2)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")
  harness.log(harness.format_table(results, keys))


if __name__ == "__main__":
  main()
