"""The demo: TRIME against vanilla and the continuous cache on the demo corpus.

    python -m memjax.demos.trime --workdir=runs/demo

Rows (Tables 2-3 of the TRIME paper, at demo scale):

* vanilla: the plain LM objective, evaluated without memory;
* vanilla + continuous cache: the vanilla checkpoint with Grave et al.'s
  cache over the local and long-term memory (lambda, theta and the memory
  size tuned on valid);
* TRIMELM: the TRIME loss with local memory, evaluated with M_local (tau
  tuned on valid);
* TRIMELM_long: the TRIME loss with long-term in-batch memory (random blocks
  of consecutive segments), evaluated with M_local u M_long (tau and the
  memory size tuned on valid).

Every trained row trains the same number of steps on the same model and
batch size; test is scored once, at the setting chosen on valid. The table
lands in ``<workdir>/table.md`` and ``<workdir>/table.json``. A row whose
workdir already holds a finished run is only re-evaluated, so an interrupted
demo continues where it stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "Output directory.")
_STEPS = flags.DEFINE_integer(
    "steps", None, "Override the training steps of every row."
)
_ROWS = flags.DEFINE_list("rows", None, "Subset of rows to run (default: all).")

# (row name, config variant of configs/trime_wt103.py, memory kind tuned at
# evaluation or None, the row whose checkpoint it evaluates or None to train).
ROWS = (
    ("vanilla", "demo", None, None),
    ("vanilla + continuous cache", "demo", "cache", "vanilla"),
    ("TRIMELM", "trime_demo", "trime", None),
    ("TRIMELM_long", "trime_long_demo", "trime", None),
)


def _load_config(variant: str):
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top

  return trime_wt103.get_config(variant)


def _dirname(row: str) -> str:
  return "".join(c if c.isalnum() else "_" for c in row).strip("_").lower()


def _setting(r: dict) -> str:
  best = r.get("best")
  if not best:
    return "-"
  parts = []
  if "long_mem_tokens" in best:
    parts.append(f"N={best['long_mem_tokens']}")
  if "temperature" in best:
    parts.append(f"tau={best['temperature']:g}")
  if "cache_theta" in best:
    parts.append(
        f"theta={best['cache_theta']:g}, lambda={best['cache_lambda']:g}"
    )
  return ", ".join(parts)


def format_table(rows: list[dict]) -> str:
  """Markdown table of valid/test perplexity per row."""
  lines = [
      "| model | params | steps | memory at evaluation | valid ppl | test ppl "
      "| test ppl without memory | train tokens/s |",
      "|---|---:|---:|---|---:|---:|---:|---:|",
  ]
  for r in rows:
    tps = r.get("train_tokens_per_s")
    lines.append(
        f"| {r['row']} | {r['num_params']:,} | {r['step']} | {_setting(r)} | "
        f"{r['valid']['ppl']:.2f} | {r['test']['ppl']:.2f} | "
        f"{r['test_plain']['ppl']:.2f} | {f'{tps:.0f}' if tps else '-'} |"
    )
  u = rows[0]["unigram"]
  lines.append(
      f"| unigram (train counts, add-one) | - | - | - | {u['valid']['ppl']:.2f} | "
      f"{u['test']['ppl']:.2f} | - | - |"
  )
  return "\n".join(lines)


def run_row(
    name: str, variant: str, kind, source, workdir: str, cache: str, steps
) -> dict:
  """Trains (or reuses) one row's model and evaluates it; returns the row."""
  from memjax.modes import memory as memory_modes  # pylint: disable=g-import-not-at-top
  from memjax import train  # pylint: disable=g-import-not-at-top

  cfg = _load_config(variant)
  cfg.data.cache_dir = cache
  if steps:
    cfg.train.num_steps = steps
  row_dir = os.path.join(workdir, _dirname(name))
  if source is None:
    print(
        f"== {name}: train {cfg.name}, {cfg.train.num_steps} steps", flush=True
    )
    res = train.train_and_evaluate(cfg, row_dir)
  else:
    with open(os.path.join(workdir, _dirname(source), "row.json")) as f:
      res = dict(json.load(f))
    cfg.train.init_from = os.path.join(workdir, _dirname(source))
  res.update(row=name, test_plain=res["test"], valid_plain=res["valid"])
  if kind is not None:
    cfg.eval_memory.kind = kind
    print(f"== {name}: tune the {kind} memory on valid", flush=True)
    tuned = memory_modes.tune(cfg, row_dir)
    res.update(
        valid=tuned["valid"]["memory"],
        test=tuned["test"]["memory"],
        best=tuned["best"],
        grid_valid=tuned["grid_valid"],
    )
    if source is not None:
      res.pop("train_tokens_per_s", None)
  with open(os.path.join(row_dir, "row.json"), "w") as f:
    json.dump(res, f, indent=2, sort_keys=True)
  return res


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  import jax  # pylint: disable=g-import-not-at-top
  import platform  # pylint: disable=g-import-not-at-top

  os.makedirs(_WORKDIR.value, exist_ok=True)
  cache = os.path.join(_WORKDIR.value, "cache")
  rows = []
  start = time.time()
  for name, variant, kind, source in ROWS:
    if _ROWS.value and name not in _ROWS.value:
      continue
    rows.append(
        run_row(
            name, variant, kind, source, _WORKDIR.value, cache, _STEPS.value
        )
    )
  table = format_table(rows)
  elapsed = time.time() - start
  machine = (
      f"{platform.machine()}, {os.cpu_count()} CPU cores, "
      f"{jax.devices()[0].platform}, jax {jax.__version__}"
  )
  with open(os.path.join(_WORKDIR.value, "table.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(_WORKDIR.value, "table.json"), "w") as f:
    json.dump(
        {"rows": rows, "seconds": elapsed, "machine": machine},
        f,
        indent=2,
        sort_keys=True,
    )
  print(
      f"\nDemo corpus (WikiText format, {len(rows)} rows, {elapsed:.0f}s on "
      f"{machine}):\n{table}\n"
  )
  print(f"written: {os.path.join(_WORKDIR.value, 'table.md')}")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
