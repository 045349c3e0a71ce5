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
table at the end (stderr). ``--matmuls`` also reads the lowering's HLO and
adds up its matrix products alone (``dot``: 2 x output elements x
contracted size, times the calls of the computation that holds it), to
tell the products, which the formula counts, from the elementwise work,
which it leaves out.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness  # pylint: disable=g-import-not-at-top

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT )?%?(\S+) = \w+\[([0-9,]*)\]\S* ([\w-]+)\((.*?)\)(.*)$"
)
_CALLS = re.compile(r"(?:to_apply|body|condition|calls)=%?([\w.\-]+)")


def _dims(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x]


def matmul_flops(hlo: str) -> float:
  """FLOPs of the ``dot`` instructions of an HLO module's text, each
  computation counted as often as it is called (``call``, ``while``; the
  unrolled step has no loop left, so each body runs once per call)."""
  bodies: dict[str, list[str]] = {}
  name, entry = None, None
  for line in hlo.splitlines():
    head = re.match(r"^(ENTRY )?%?(\S+) .*\{\s*$", line)
    if head:
      name = head.group(2)
      bodies[name] = []
      entry = name if head.group(1) else entry
    elif name is not None and line.startswith(" "):
      bodies[name].append(line)
  shapes = {}
  for lines in bodies.values():
    for line in lines:
      m = _INSTRUCTION.match(line)
      if m:
        shapes[m.group(1)] = _dims(m.group(2))
  calls: collections.Counter[str] = collections.Counter()
  todo = [(entry, 1)]
  while todo:
    comp, times = todo.pop()
    calls[comp] += times
    for line in bodies[comp]:
      if re.search(r" (call|while|conditional)\(", line):
        todo += [(c, times) for c in _CALLS.findall(line)]
  total = 0.0
  for comp, times in calls.items():
    for line in bodies[comp]:
      m = _INSTRUCTION.match(line)
      if not m or m.group(3) != "dot":
        continue
      lhs = shapes[m.group(4).split(",")[0].strip().lstrip("%")]
      contract = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", line)
      size = 1
      for d in _dims(contract.group(1)) if contract else []:
        size *= lhs[d]
      out = 1
      for d in _dims(m.group(2)):
        out *= d
      total += 2.0 * out * size * times
  return total


def measure(
    config: str,
    overrides: list[str],
    devices: int,
    xla: bool,
    matmuls: bool = False,
):
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
  if xla and matmuls:
    from memjax.models import stack  # pylint: disable=g-import-not-at-top

    with stack.unrolled():
      hlo = step.make_fn().lower(*step.args).as_text(dialect="hlo")
    out["xla_matmuls"] = matmul_flops(hlo) / step.tokens / 1e9
  out["seconds"] = time.perf_counter() - start
  return out


def table(results: list[dict[str, Any]]) -> str:
  """The results as a markdown table."""
  lines = [
      "| config | XLA GFLOPs/token | formula before | formula | XLA / formula "
      "| XLA's products | products / formula |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
  ]
  for r in results:
    xla = "-" if r["xla"] is None else f"{r['xla']:.4g}"
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
    products, share = "-", "-"
    if r.get("xla_matmuls") is not None:
      products = f"{r['xla_matmuls']:.4g}"
      share = f"{r['xla_matmuls'] / r['formula']:.3f}"
    lines.append(
        f"| `{r['config']}` | {xla} | {r['formula_before']:.4g} | "
        f"{r['formula']:.4g} | {ratio} | {products} | {share} |"
    )
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument(
      "--config",
      action="append",
      default=[],
      help="a config file and variant (repeat for several)",
  )
  parser.add_argument("--devices", type=int, default=1)
  parser.add_argument(
      "--set",
      action="append",
      default=[],
      metavar="KEY=VALUE",
      help=harness.SET_HELP,
  )
  parser.add_argument(
      "--no-xla",
      dest="xla",
      action="store_false",
      help="the formula only (no lowering)",
  )
  parser.add_argument(
      "--matmuls",
      action="store_true",
      help="also XLA's matrix products alone, from the lowering's HLO",
  )
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "")
      + f" --xla_force_host_platform_device_count={args.devices}"
  )
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  results = []
  for config in args.config or ["configs/txl_wt103.py:smoke"]:
    r = measure(config, args.set, args.devices, args.xla, args.matmuls)
    print(json.dumps(r), flush=True)
    results.append(r)
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"machine": harness.machine(), "results": results}, f, indent=2)
  harness.log(table(results))


if __name__ == "__main__":
  main()
