"""The demo: train and evaluate on the shipped demo corpus, print a table.

    python -m memjax.demo --workdir=runs/demo

Each row trains one configuration for the same number of steps on the demo
WikiText corpus (``demo_data/wikitext``), evaluates it on valid and test, and
the table lands in ``<workdir>/table.md`` and ``<workdir>/table.json``. A row
whose workdir already holds a finished run is resumed (that is, only
re-evaluated), so an interrupted demo continues where it stopped.
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
_STEPS = flags.DEFINE_integer("steps", None, "Override the training steps of every row.")
_ROWS = flags.DEFINE_list("rows", None, "Subset of rows to run (default: all).")

# (row name, config variant of configs/trime_wt103.py, evaluation overrides)
ROWS = (
    ("vanilla", "demo", {}),
)


def _load_config(variant: str):
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top
  return trime_wt103.get_config(variant)


def format_table(rows: list[dict]) -> str:
  """Markdown table of valid/test perplexity per row."""
  lines = ["| model | params | valid ppl | test ppl | train tokens/s |",
           "|---|---:|---:|---:|---:|"]
  for r in rows:
    tps = r.get("train_tokens_per_s")
    lines.append(
        f"| {r['row']} | {r['num_params']:,} | {r['valid']['ppl']:.2f} | "
        f"{r['test']['ppl']:.2f} | {f'{tps:.0f}' if tps else '-'} |")
  u = rows[0]["unigram"]
  lines.append(f"| unigram (train counts, add-one) | - | {u['valid']['ppl']:.2f} | "
               f"{u['test']['ppl']:.2f} | - |")
  return "\n".join(lines)


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from memjax import train  # pylint: disable=g-import-not-at-top
  os.makedirs(_WORKDIR.value, exist_ok=True)
  cache = os.path.join(_WORKDIR.value, "cache")
  rows = []
  start = time.time()
  for name, variant, overrides in ROWS:
    if _ROWS.value and name not in _ROWS.value:
      continue
    cfg = _load_config(variant)
    cfg.data.cache_dir = cache
    if _STEPS.value:
      cfg.train.num_steps = _STEPS.value
    for k, v in overrides.items():
      node = cfg
      *parents, leaf = k.split(".")
      for p in parents:
        node = getattr(node, p)
      setattr(node, leaf, v)
    print(f"== {name}: {cfg.name}, {cfg.train.num_steps} steps", flush=True)
    res = train.train_and_evaluate(cfg, os.path.join(_WORKDIR.value, name))
    res["row"] = name
    rows.append(res)
  table = format_table(rows)
  with open(os.path.join(_WORKDIR.value, "table.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(_WORKDIR.value, "table.json"), "w") as f:
    json.dump(rows, f, indent=2, sort_keys=True)
  print(f"\nDemo corpus (WikiText format, {len(rows)} rows, "
        f"{time.time() - start:.0f}s):\n{table}\n")
  print(f"written: {os.path.join(_WORKDIR.value, 'table.md')}")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
