"""One command for a lent GPU or TPU: measured speed beside --mode=plan's.

    make accelerator-check                 # = PYTHONPATH=. python3 \\
        benchmarks/accelerator_check.py    #   [--budget_s=300] [--out=DIR]
    python benchmarks/accelerator_check.py --tiny   # the same on a CPU, ~1 min

Runs offline on a machine with one or more GPUs or TPU chips and a stock
JAX (jax, jaxlib, flax, optax, orbax-checkpoint; no TensorFlow, SeqIO or
ScaNN needed), within ``--budget_s`` seconds (default 300), and writes
``accelerator_check.json`` and ``accelerator_check.md`` to ``--out``
(default ``runs/accelerator_check``), rewritten after every item, so what
was measured survives a failure or the end of the budget. memjax needs
``ml_collections`` (pure Python; its own needs, absl-py and PyYAML, come
with optax and flax); an image without it takes its wheel on the path:
``make accelerator-check ACCEL_PATH=ml_collections-1.1.0-py3-none-any.whl``.

What it measures, on one device (docs/plan.md, "Measured on an
accelerator"):

* the machine: platform, device kind and count, versions;
* the train step of ``accelerator_report.ITEMS`` (TRIMELM and the vanilla
  LM at 7M and 150M, Transformer-XL and LaMemo at enwik8, BERT-base with
  and without PKM): compile time, step time, tokens/s, peak device memory
  and MFU, each beside ``--mode=plan``'s prediction for one device of the
  same kind at the same batch, and the ratios of each method to its
  baseline (``accelerator_report.RATIOS``);
* kNN search over ``--knn_keys`` random keys of trime_7m's width: exact
  top-k on the device against ScaNN on the host.

Each item runs in its own process (``benchmarks/accelerator_measure.py``):
one that fails records its one-line error and the check goes on; one that
runs past the budget is stopped; items not started within the budget are
"skipped: budget". The predictions come from ``python -m memjax.main
--mode=plan --config.plan.devices=1 --config.plan.platform=P`` run in
parallel on the host's CPU (``--plan_jobs``), each writing ``plan.json``
under ``<out>/plans/`` (reused by a later run with the same request; a
plan can be computed on any CPU beforehand with ``--plans_only
--platform=P``). Bad input (an unknown item, a bad override) exits with
status 2 and one line; otherwise the status is 0 and the files say what
happened.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# pylint: disable=g-import-not-at-top
from benchmarks import accelerator_report as report_lib
from benchmarks import accelerator_runner as runner

DEFAULT_OUT = os.path.join("runs", "accelerator_check")
TINY_VOCAB = 8192  # with --tiny: the word-level configs' vocabulary
TINY_KNN = {"keys": 20_000, "queries": 64, "k": 32}
FULL_KNN = {"keys": 1_000_000, "queries": 1024, "k": 1024}


class BadInput(ValueError):
  """A flag or config the check cannot run with (exit status 2)."""


class Parser(argparse.ArgumentParser):
  """argparse that says what is wrong in one line (status 2), no usage."""

  def error(self, message: str):
    self.exit(2, f"accelerator_check: error: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = Parser(description=__doc__.split("\n\n")[0])
  add = p.add_argument
  add("--out", default=DEFAULT_OUT, help="folder of the JSON and Markdown")
  add("--budget_s", type=float, default=300.0, help="seconds for it all")
  add("--tiny", action="store_true", help="smoke-sized configs (a CPU)")
  add("--items", default=",".join(report_lib.NAMES), help="which to run")
  add("--batch", action="append", default=[], metavar="ITEM=ROWS")
  add("--set", action="append", default=[], metavar="KEY=VALUE")
  add("--steps", type=int, default=0, help="steps per round (0: 5, tiny 2)")
  add("--rounds", type=int, default=0, help="rounds (0: 3, tiny 1)")
  add("--warmup", type=int, default=1, help="untimed steps (>= 1)")
  add("--max_halvings", type=int, default=3, help="batch halvings on OOM")
  add("--knn_keys", type=int, default=0, help="0: 1,000,000 (tiny 20,000)")
  add("--knn_queries", type=int, default=0, help="0: 1,024 (tiny 64)")
  add("--knn_k", type=int, default=0, help="0: 1,024 (tiny 32)")
  add("--platform", default="", help="plan platform (default: the device's)")
  add("--plans_only", action="store_true", help="only the plans (a CPU)")
  add("--plan_jobs", type=int, default=0, help="0: cores / 4, 1 to 4")
  args = p.parse_args(argv)
  tiny = args.tiny
  args.steps = args.steps or (2 if tiny else 5)
  args.rounds = args.rounds or (1 if tiny else 3)
  knn = TINY_KNN if tiny else FULL_KNN
  for key in ("keys", "queries", "k"):
    flag = f"knn_{key}"
    setattr(args, flag, getattr(args, flag) or knn[key])
  cores = os.cpu_count() or 1
  args.plan_jobs = args.plan_jobs or max(1, min(4, cores // 4))
  try:
    check_args(args)
  except BadInput as e:
    p.error(str(e))
  return args


def check_args(args: argparse.Namespace) -> None:
  """Raises BadInput for values out of range or names not known."""
  items = [x for x in args.items.split(",") if x]
  unknown = sorted(set(items) - set(report_lib.NAMES))
  if unknown or not items:
    raise BadInput(
        f"--items: unknown {unknown}; use some of {report_lib.NAMES}"
    )
  args.items = items
  batches = {}
  for text in args.batch:
    name, _, rows = text.partition("=")
    trained = {i.name for i in report_lib.ITEMS}
    if name not in trained or not rows.isdigit() or rows == "0":
      raise BadInput(f"--batch {text!r}: use ITEM=ROWS, ITEM a trained item")
    batches[name] = int(rows)
  args.batch = batches
  for flag in ("steps", "rounds", "warmup", "knn_keys", "knn_queries"):
    if getattr(args, flag) < 1:
      raise BadInput(f"--{flag} must be >= 1")
  if not 1 <= args.knn_k <= args.knn_keys:
    raise BadInput(f"--knn_k must be in [1, --knn_keys={args.knn_keys}]")
  if args.budget_s < 0 or args.max_halvings < 0:
    raise BadInput("--budget_s and --max_halvings must be >= 0")
  if args.plans_only and not args.platform:
    raise BadInput("--plans_only needs --platform (e.g. h200)")
  if args.platform:
    from memjax import errors  # pylint: disable=g-import-not-at-top
    from memjax.modes import platforms  # pylint: disable=g-import-not-at-top

    try:
      platforms.get(args.platform)
    except errors.ConfigError as e:
      raise BadInput(str(e)) from e


@dataclasses.dataclass
class Planned:
  """An item as it will run: its config, overrides and plan request."""

  item: report_lib.Item
  config: str
  overrides: list[str]
  vocab_size: int
  dtype: str
  d_model: int
  shape: str


def resolve(item: report_lib.Item, args: argparse.Namespace) -> Planned:
  """The item's config and overrides: the batch (``--batch``, the item's
  own for one device, or the config's), the vocabulary size (the
  config's, capped with ``--tiny``), the TRIME warm-up off, ``--set``.

  Raises:
    BadInput: a config or override that does not load.
  """
  # pylint: disable=g-import-not-at-top
  from benchmarks import harness
  from memjax import build
  from memjax import errors
  from memjax.modes import plan_compile

  config = report_lib.tiny_config(item) if args.tiny else item.config
  extra = list(item.tiny_overrides if args.tiny else ())
  rows = args.batch.get(item.name) or (0 if args.tiny else item.batch)
  if rows:
    extra.append(f"data.batch_size={rows}")
  try:
    cfg = harness.load_config(config, extra + args.set)
    vocab = plan_compile.vocab_size(build.read(cfg, build.parts()))
  except (harness.ConfigError, errors.UserError) as e:
    raise BadInput(f"{item.name}: {e}") from e
  if args.tiny:
    vocab = min(vocab, TINY_VOCAB)
  overrides = extra + [
      f"train.grad_accum={cfg.train.grad_accum}",
      f"plan.vocab_size={vocab}",
  ]
  if cfg.loss.name == "trime":
    overrides.append("trime.lm_warmup_fraction=0.0")
  return Planned(
      item,
      config,
      overrides + list(args.set),
      vocab,
      str(cfg.model.dtype),
      int(cfg.model.d_model),
      f"{cfg.data.batch_size} x {cfg.data.seq_len}",
  )


def train_spec(p: Planned, args: argparse.Namespace) -> dict[str, Any]:
  return {
      "kind": "train",
      "name": p.item.name,
      "config": p.config,
      "overrides": p.overrides,
      "vocab_size": p.vocab_size,
      "steps": args.steps,
      "rounds": args.rounds,
      "warmup": args.warmup,
      "max_halvings": args.max_halvings,
  }


def knn_spec(planned: list[Planned], args: argparse.Namespace) -> dict:
  """kNN over keys as wide as trime_7m's (its d_model; 512 without it)."""
  dims = [p.d_model for p in planned if p.item.name == "trime_7m"]
  return {
      "kind": "knn",
      "keys": args.knn_keys,
      "dim": dims[0] if dims else 512,
      "k": args.knn_k,
      "queries": args.knn_queries,
  }


def new_report(planned: list[Planned], args: argparse.Namespace) -> dict:
  """The report before anything ran: every row pending or not selected."""
  rows = []
  for p in planned:
    rows.append(
        {
            "name": p.item.name,
            "kind": "train",
            "config": p.config,
            "overrides": p.overrides,
            "shape": p.shape,
            "status": report_lib.PENDING,
            "plan": {"status": report_lib.PENDING},
        }
    )
  rows.append({"name": report_lib.KNN, "kind": "knn", "config": "-"})
  rows.sort(key=lambda r: report_lib.NAMES.index(r["name"]))
  for r in rows:
    if r["name"] not in args.items:
      r["status"] = report_lib.SKIPPED_UNSELECTED
      r.get("plan", {})["status"] = report_lib.SKIPPED_UNSELECTED
    r.setdefault("status", report_lib.PENDING)
  return {
      "check": "accelerator_check",
      "command": ["benchmarks/accelerator_check.py", *sys.argv[1:]],
      "tiny": args.tiny,
      "budget_s": args.budget_s,
      "timing": {
          "steps_per_round": args.steps,
          "rounds": args.rounds,
          "warmup_steps": args.warmup,
          "statistic": "median round",
      },
      "machine": {"status": report_lib.PENDING},
      "plan_platform": args.platform or None,
      "rows": rows,
      "ratios": [],
  }


def finish(report: dict[str, Any]) -> None:
  """Adds the measured MFU and the ratios (from the rows' own numbers)."""
  platform = report.get("plan_platform")
  for r in report["rows"]:
    m = r.get("measured")
    if r["kind"] == "train" and m is not None:
      m["mfu"] = report_lib.measured_mfu(m, platform)
  report["ratios"] = report_lib.ratios(report["rows"])


def write(report: dict[str, Any], out: str) -> None:
  """Writes the JSON and the Markdown (each replaced whole)."""
  finish(report)
  os.makedirs(out, exist_ok=True)
  for name, text in (
      ("accelerator_check.json", json.dumps(report, indent=2) + "\n"),
      ("accelerator_check.md", report_lib.markdown(report)),
  ):
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
      f.write(text)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
  missing = runner.missing_modules()
  if missing:
    print(runner.missing_line(missing), file=sys.stderr)
    return 2
  args = parse_args(argv)
  try:
    planned = [resolve(i, args) for i in report_lib.ITEMS]
  except BadInput as e:
    print(f"accelerator_check: error: {e}", file=sys.stderr)
    return 2
  report = new_report(planned, args)
  check = runner.Check(report, args, lambda: write(report, args.out))
  try:
    items = [(p.item.name, train_spec(p, args), p) for p in planned]
    items.append((report_lib.KNN, knn_spec(planned, args), None))
    check.run(sorted(items, key=lambda x: report_lib.NAMES.index(x[0])))
  except KeyboardInterrupt:
    runner.log(f"interrupted; what was measured is in {args.out}")
    return 130
  print(report_lib.markdown(report))
  runner.log(f"wrote {os.path.join(args.out, 'accelerator_check.json')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
