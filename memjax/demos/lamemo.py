"""The recurrent-memory demo: Transformer+RPE, Transformer-XL and LaMemo.

    python -m memjax.demos.lamemo --workdir=runs/lamemo_demo

Trains the ``demo`` variants of ``configs/txl_wt103.py`` (``rpe_demo``,
``demo``) and ``configs/lamemo_wt103.py`` (``demo``) on the shipped demo
corpus (``--size=char_gpu``: the character-level comparison sized for one
GPU, on the shipped enwik8 demo corpus), the same steps and data order
each, evaluates them (sliding windows for Transformer+RPE, whole streams
with the memory carried for the others), then runs ``--mode=extrapolate`` and ``--mode=analyze`` on the Transformer-XL
and LaMemo runs. Writes to ``--workdir``:

* ``table.md``, ``table.json``: valid / test perplexity, parameters,
  training tokens/s;
* ``extrapolation.csv``, ``extrapolation.png``: valid perplexity with
  memories of m x the segment length (LaMemo paper, Figure 5);
* ``attention_by_distance.png``: mean attention weight by distance, averaged
  over layers, both models (Figure 1); the LaMemo run's ``alpha.png``
  (Figure 6) stays in its row directory;
* one directory per row with that run's checkpoints, results and files.

A row whose directory already holds a finished run is only re-evaluated.
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

_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/lamemo_demo", "Output directory."
)
_STEPS = flags.DEFINE_integer(
    "steps", None, "Override the training steps of every row."
)
_SIZE = flags.DEFINE_string(
    "size", "demo", "Size of every row's config (demo, char_gpu, smoke, ...)."
)
_ROWS = flags.DEFINE_list("rows", None, "Subset of rows (rpe, xl, lamemo).")
_RATIOS = flags.DEFINE_list(
    "ratios",
    None,
    "Memory / segment length ratios " "for the extrapolation (default: 1..10).",
)
_EXTRAPOLATE_SEGMENTS = flags.DEFINE_integer(
    "extrapolate_segments",
    0,
    "Segments per lane for the extrapolation " "(0 = the whole valid split).",
)
_ANALYZE = flags.DEFINE_bool("analyze", True, "Run the attention analyses.")

# (key, row name, config file, method; the variant is METHOD_SIZE)
ROWS = (
    ("rpe", "Transformer+RPE", "txl_wt103", "rpe"),
    ("xl", "Transformer-XL", "txl_wt103", "txl"),
    ("lamemo", "LaMemo", "lamemo_wt103", "lamemo"),
)


def load_config(module: str, variant: str):
  import importlib  # pylint: disable=g-import-not-at-top

  return importlib.import_module(f"configs.{module}").get_config(variant)


def format_table(rows: list[dict]) -> str:
  """Markdown table: one line per model, then the unigram floor."""
  unit = rows[0]["unit"]
  lines = [
      f"| model | params | memory | valid {unit} | test {unit} | "
      "train tokens/s |",
      "|---|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    tps = r.get("train_tokens_per_s")
    lines.append(
        f"| {r['row']} | {r['num_params']:,} | {r['mem_len']} | "
        f"{r['valid'][unit]:.2f} | {r['test'][unit]:.2f} | "
        f"{f'{tps:.0f}' if tps else '-'} |"
    )
  u = rows[0]["unigram"]
  lines.append(
      f"| unigram (train counts, add-one) | - | - | "
      f"{u['valid'][unit]:.2f} | {u['test'][unit]:.2f} | - |"
  )
  return "\n".join(lines)


def train_rows(out_dir: str) -> tuple[list[dict], dict]:
  """Trains and evaluates each selected row; returns (results, configs)."""
  from memjax import train  # pylint: disable=g-import-not-at-top

  cache = os.path.join(out_dir, "cache")
  rows, configs = [], {}
  for key, name, module, method in ROWS:
    if _ROWS.value and key not in _ROWS.value:
      continue
    cfg = load_config(module, f"{method}_{_SIZE.value}")
    cfg.data.cache_dir = cache
    if _STEPS.value:
      cfg.train.num_steps = _STEPS.value
    if _RATIOS.value:
      cfg.extrapolate.ratios = tuple(int(m) for m in _RATIOS.value)
    cfg.extrapolate.max_segments = _EXTRAPOLATE_SEGMENTS.value
    print(f"== {name}: {cfg.name}, {cfg.train.num_steps} steps", flush=True)
    res = train.train_and_evaluate(cfg, os.path.join(out_dir, key))
    res.update(row=name, key=key, mem_len=cfg.model.mem_len)
    rows.append(res)
    configs[key] = cfg
  return rows, configs


def extrapolate(out_dir, recurrent, configs, unit) -> None:
  """Figure 5 for the recurrent rows: CSV, plot and a printed table."""
  from memjax.methods.recurrent import extrapolate  # pylint: disable=g-import-not-at-top

  curves, csv_rows = {}, []
  for key, name in recurrent:
    res = extrapolate.extrapolate(configs[key], os.path.join(out_dir, key))
    curves[name] = res["rows"]
    csv_rows += [{"model": name, **r} for r in res["rows"]]
  extrapolate.write_csv(os.path.join(out_dir, "extrapolation.csv"), csv_rows)
  extrapolate.plot_extrapolation(
      os.path.join(out_dir, "extrapolation.png"),
      curves,
      unit,
      f"demo corpus, segments of {csv_rows[0]['segment_len']}, trained with "
      f"memory {configs[recurrent[0][0]].model.mem_len}",
  )
  lines = [
      f"| m | memory | " + " | ".join(curves) + " |",
      "|---:|---:|" + "---:|" * len(curves),
  ]
  for i, r in enumerate(next(iter(curves.values()))):
    lines.append(
        f"| {r['m']} | {r['mem_len']} | "
        + " | ".join(f"{c[i][unit]:.2f}" for c in curves.values())
        + " |"
    )
  extrapolation_table = "\n".join(lines)
  with open(os.path.join(out_dir, "extrapolation.md"), "w") as f:
    f.write(extrapolation_table + "\n")
  print(
      f"\nValid {unit} with memory m x segment length:\n"
      f"{extrapolation_table}\n",
      flush=True,
  )


def analyze(out_dir, recurrent, configs) -> None:
  """Figures 1 and 6 for the recurrent rows."""
  from memjax.methods.recurrent import analysis  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  dist = {}
  for key, name in recurrent:
    summary = analysis.analyze(configs[key], os.path.join(out_dir, key))
    dist[name] = np.nanmean(
        np.load(os.path.join(out_dir, key, "attention_by_distance.npy")),
        axis=0,
    )
    alpha = summary.get("alpha_mean_by_layer")
    print(
        f"{name}: attention mass on the memory by layer "
        f"{[round(x, 3) for x in summary['memory_share_by_layer']]}"
        + (
            f"; mean alpha by layer {[round(x, 3) for x in alpha]}"
            if alpha is not None
            else ""
        ),
        flush=True,
    )
  analysis.plot_attention_by_distance(
      os.path.join(out_dir, "attention_by_distance.png"),
      dist,
      configs[recurrent[0][0]].data.seq_len,
      "demo corpus, valid: mean over layers",
  )


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  out_dir = _WORKDIR.value
  os.makedirs(out_dir, exist_ok=True)
  start = time.time()
  rows, configs = train_rows(out_dir)
  table = format_table(rows)
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(out_dir, "table.json"), "w") as f:
    json.dump(rows, f, indent=2, sort_keys=True)
  print(
      f"\nDemo corpus ({len(rows)} rows, {time.time() - start:.0f}s):\n"
      f"{table}\n",
      flush=True,
  )
  recurrent = [(r["key"], r["row"]) for r in rows if r["mem_len"] > 0]
  if recurrent:
    extrapolate(out_dir, recurrent, configs, rows[0]["unit"])
    if _ANALYZE.value:
      analyze(out_dir, recurrent, configs)
  print(f"written: {out_dir} ({time.time() - start:.0f}s)")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
