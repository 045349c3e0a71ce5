"""The product-key memory demo: the memory-less LM, PKM and ResM.

    python -m memjax.demos.pkm --workdir=runs/pkm_demo

Trains the ``demo``, ``pkm_demo`` and ``resm_demo`` variants of
``configs/pkm_wt103.py`` on the shipped demo corpus (the same model, steps
and data order each; memory layers 2 and 3 of 4 with 128^2 slots), evaluates
them, and runs ``--mode=memory_usage`` over the valid split on the two
memory models. Writes to ``--workdir``:

* ``table.md``, ``table.json``: valid / test perplexity, parameters,
  training tokens/s, and per memory layer MU, top-1 MU, KL_u, KL_w;
* one directory per row with that run's checkpoints, results,
  ``memory_usage.json`` and ``memory_usage.png``.

A row whose directory already holds a run finished with the same steps
(and its usage, for a memory model) is read back, not run again; rows can
run in separate processes (``--rows``) and a last call makes the table.
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

_WORKDIR = flags.DEFINE_string("workdir", "runs/pkm_demo", "Output directory.")
_STEPS = flags.DEFINE_integer(
    "steps", None, "Override the training steps of every row."
)
_ROWS = flags.DEFINE_list("rows", None, "Subset of rows (vanilla, pkm, resm).")

# (key, row name, variant of configs/pkm_wt103.py)
ROWS = (
    ("vanilla", "Transformer (no memory)", "demo"),
    ("pkm", "PKM (memory replaces FFN)", "pkm_demo"),
    ("resm", "ResM (FFN + memory)", "resm_demo"),
)


def format_table(rows: list[dict]) -> str:
  """Markdown table: one line per model and memory layer."""
  unit = rows[0]["unit"]
  lines = [
      f"| model | params | valid {unit} | test {unit} | train tokens/s | "
      "memory layer | MU | top-1 MU | KL_u | KL_w |",
      "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
  ]
  for r in rows:
    tps = r.get("train_tokens_per_s")
    head = (
        f"| {r['row']} | {r['num_params']:,} | {r['valid'][unit]:.2f} | "
        f"{r['test'][unit]:.2f} | {f'{tps:.0f}' if tps else '-'} |"
    )
    usage = r.get("usage") or {"-": None}
    for layer, m in usage.items():
      if m is None:
        lines.append(head + " - | - | - | - | - |")
      else:
        lines.append(
            head + f" {layer.split('/')[0]} | {m['mu']:.3f} | "
            f"{m['top1_mu']:.3f} | {m['kl_u']:.3f} | {m['kl_w']:.3f} |"
        )
      head = "| | | | | |"
  u = rows[0]["unigram"]
  lines.append(
      f"| unigram (train counts, add-one) | - | {u['valid'][unit]:.2f} | "
      f"{u['test'][unit]:.2f} | - | | | | | |"
  )
  return "\n".join(lines)


def _finished(cfg, workdir: str) -> dict | None:
  """The results of a row whose run finished ``cfg``'s steps (and, for a
  memory model, measured its usage) in ``workdir``; None otherwise."""
  try:
    with open(os.path.join(workdir, "results.json")) as f:
      res = json.load(f)
    if res["step"] != cfg.train.num_steps:
      return None
    if cfg.model.feed_forward != "ffn":
      with open(os.path.join(workdir, "memory_usage.json")) as f:
        res["usage"] = json.load(f)["layers"]
  except (OSError, KeyError, ValueError):
    return None
  print(f"reusing the finished run in {workdir}", flush=True)
  return res


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from configs import pkm_wt103  # pylint: disable=g-import-not-at-top
  from memjax.methods.pkm import usage as pkm_usage
  from memjax import train

  out_dir = _WORKDIR.value
  os.makedirs(out_dir, exist_ok=True)
  cache = os.path.join(out_dir, "cache")
  start = time.time()
  rows = []
  for key, name, variant in ROWS:
    if _ROWS.value and key not in _ROWS.value:
      continue
    cfg = pkm_wt103.get_config(variant)
    cfg.data.cache_dir = cache
    if _STEPS.value:
      cfg.train.num_steps = _STEPS.value
      cfg.train.eval_every = cfg.train.checkpoint_every = _STEPS.value
    print(f"== {name}: {cfg.name}, {cfg.train.num_steps} steps", flush=True)
    workdir = os.path.join(out_dir, key)
    res = _finished(cfg, workdir)
    if res is None:
      res = train.train_and_evaluate(cfg, workdir)
      if cfg.model.feed_forward != "ffn":
        res["usage"] = pkm_usage.memory_usage(cfg, workdir)["layers"]
    res.update(row=name, key=key)
    rows.append(res)
  table = format_table(rows)
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(out_dir, "table.json"), "w") as f:
    json.dump(rows, f, indent=2, sort_keys=True, default=str)
  print(
      f"\nDemo corpus ({len(rows)} rows, {time.time() - start:.0f}s):\n"
      f"{table}\n",
      flush=True,
  )
  print(f"written: {out_dir} ({time.time() - start:.0f}s)")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
