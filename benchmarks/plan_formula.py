"""XLA's FLOPs per token of a config's train step against the plan's formula.

Builds the run as ``--mode=plan`` does (``memjax.modes.plan_compile``:
abstract state and batch, nothing allocated) on N fake CPU devices, lowers
the train step with every scan unrolled and reads XLA's cost analysis of
that lowering (the whole program; nothing is compiled), then prints, per
config, XLA's GFLOPs per token, the formula's (``memjax.modes.plan.
formula_flops``: with the recomputation the step does; "before" is the
same without the terms the methods declare), and XLA's over the formula's.

    python benchmarks/plan_formula.py \\
        --config=configs/txl_wt103.py:base \\
        --config=configs/pkm_bert.py:pkm_base [--devices=1] \\
        [--set model.num_layers=2] [--no-xla] [--out=report.json]

Prints one JSON line per config as it finishes (stdout) and a markdown
table at the end (stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness  # pylint: disable=g-import-not-at-top


def measure(config: str, overrides: list[str], devices: int, xla: bool):
  """XLA's FLOPs per token (None without ``xla``) and the formula's."""
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax.modes import plan  # pylint: disable=g-import-not-at-top
  from memjax.modes import plan_compile  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  cfg = harness.load_config(config, overrides)
  cfg.plan.devices = devices
  run = build.build(cfg, "")
  start = time.perf_counter()
  step = plan_compile.build_step(run, jax.devices()[:devices])
  formula = plan.step_formula(step)
  out: dict[str, Any] = {
      "config": config,
      "overrides": list(overrides),
      "num_params": step.num_params,
      "tokens_per_step": step.tokens,
      "formula_before": formula["before"] / 1e9,
      "formula": formula["with_recompute"] / 1e9,
      "formula_model": formula["model"] / 1e9,
      "terms": {k: v / 1e9 for k, v in formula["terms"].items()},
      "xla": None,
      "ratio": None,
  }
  if xla:
    flops = plan_compile.program_flops(step.make_fn, step.args)
    out["xla"] = flops / step.tokens / 1e9
    out["ratio"] = out["xla"] / out["formula"]
  out["seconds"] = time.perf_counter() - start
  return out


def table(results: list[dict[str, Any]]) -> str:
  """The results as a markdown table."""
  lines = [
      "| config | XLA GFLOPs/token | formula before | formula | XLA / formula |",
      "| --- | ---: | ---: | ---: | ---: |",
  ]
  for r in results:
    xla = "-" if r["xla"] is None else f"{r['xla']:.4g}"
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
    lines.append(
        f"| `{r['config']}` | {xla} | {r['formula_before']:.4g} | "
        f"{r['formula']:.4g} | {ratio} |"
    )
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument(
      "--config", action="append", default=[],
      help="a config file and variant (repeat for several)",
  )  # fmt: skip
  parser.add_argument("--devices", type=int, default=1)
  parser.add_argument(
      "--set", action="append", default=[], metavar="KEY=VALUE",
      help=harness.SET_HELP,
  )  # fmt: skip
  parser.add_argument(
      "--no-xla", dest="xla", action="store_false",
      help="the formula only (no lowering)",
  )  # fmt: skip
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "")
      + f" --xla_force_host_platform_device_count={args.devices}"
  )
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  results = []
  for config in args.config or ["configs/txl_wt103.py:smoke"]:
    r = measure(config, args.set, args.devices, args.xla)
    print(json.dumps(r), flush=True)
    results.append(r)
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"machine": harness.machine(), "results": results}, f,
                indent=2)  # fmt: skip
  harness.log(table(results))


if __name__ == "__main__":
  main()
