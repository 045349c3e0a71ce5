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

A row whose directory already holds a run finished with the same steps is
read back, not run again.
"""

from __future__ import annotations

import functools
from typing import Any

from absl import flags

import memjax
from memjax.io import paths
from memjax.demos import common

FLAGS = common.define_flags(
    "runs/lamemo_demo", rows="Subset of rows (rpe, xl, lamemo)."
)
_SIZE = flags.DEFINE_string(
    "size", "demo", "Size of every row's config (demo, char_gpu, smoke, ...)."
)
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

# The variant of each row's config file is METHOD_SIZE (--size).
ROWS = (
    common.Row("rpe", "Transformer+RPE", "txl_wt103", "rpe"),
    common.Row("xl", "Transformer-XL", "txl_wt103", "txl"),
    common.Row("lamemo", "LaMemo", "lamemo_wt103", "lamemo"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
  """Markdown table: one line per model, then the unigram floor."""
  unit = rows[0]["unit"]
  body = [
      [
          r["row"],
          f"{r['num_params']:,}",
          r["mem_len"],
          f"{r['valid'][unit]:.2f}",
          f"{r['test'][unit]:.2f}",
          common.tokens_per_s(r),
      ]
      for r in rows
  ]
  body.append([common.UNIGRAM, "-", "-", *common.unigram(rows, unit), "-"])
  head = [
      "model",
      "params",
      "memory",
      f"valid {unit}",
      f"test {unit}",
      "train tokens/s",
  ]
  return common.markdown(head, "lrrrrr", body)


def train_row(
    demo: common.Demo,
    row: common.Row,
    steps: int | None,
    configs: dict[str, Any],
) -> dict[str, Any]:
  """Trains (or reads back) and evaluates one row; keeps its config in
  ``configs``."""
  variant = f"{row.variant}_{_SIZE.value}"
  cfg = demo.config(row.config, variant, steps)
  if _RATIOS.value:
    cfg.extrapolate.ratios = tuple(int(m) for m in _RATIOS.value)
  cfg.extrapolate.max_segments = _EXTRAPOLATE_SEGMENTS.value
  print(f"== {row.label}: {cfg.name}, {cfg.train.num_steps} steps", flush=True)
  res = common.train(cfg, demo.run_dir(row))
  res.update(row=row.label, key=row.key, mem_len=cfg.model.mem_len)
  configs[row.key] = cfg
  return res


def extrapolate(out_dir, recurrent, configs, unit) -> None:
  """Figure 5 for the recurrent rows: CSV, plot and a printed table."""
  from memjax.methods.recurrent import extrapolate  # pylint: disable=g-import-not-at-top

  curves, csv_rows = {}, []
  for key, name in recurrent:
    res = memjax.run_mode("extrapolate", configs[key], paths.join(out_dir, key))
    curves[name] = res["rows"]
    csv_rows += [{"model": name, **r} for r in res["rows"]]
  extrapolate.write_csv(paths.join(out_dir, "extrapolation.csv"), csv_rows)
  extrapolate.plot_extrapolation(
      paths.join(out_dir, "extrapolation.png"),
      curves,
      unit,
      f"demo corpus, segments of {csv_rows[0]['segment_len']}, trained with "
      f"memory {configs[recurrent[0][0]].model.mem_len}",
  )
  extrapolation_table = common.markdown(
      ["m", "memory", *curves],
      "rr" + "r" * len(curves),
      (
          [
              r["m"],
              r["mem_len"],
              *(f"{c[i][unit]:.2f}" for c in curves.values()),
          ]
          for i, r in enumerate(next(iter(curves.values())))
      ),
  )
  with paths.open(paths.join(out_dir, "extrapolation.md"), "w") as f:
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
    summary = memjax.run_mode("analyze", configs[key], paths.join(out_dir, key))
    dist[name] = np.nanmean(
        paths.np_load(paths.join(out_dir, key, "attention_by_distance.npy")),
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
      paths.join(out_dir, "attention_by_distance.png"),
      dist,
      configs[recurrent[0][0]].data.seq_len,
      "demo corpus, valid: mean over layers",
  )


def main() -> None:
  configs = {}
  demo, rows = common.run_rows(
      FLAGS, ROWS, functools.partial(train_row, configs=configs), format_table
  )
  recurrent = [(r["key"], r["row"]) for r in rows if r["mem_len"] > 0]
  if recurrent:
    extrapolate(demo.workdir, recurrent, configs, rows[0]["unit"])
    if _ANALYZE.value:
      analyze(demo.workdir, recurrent, configs)


if __name__ == "__main__":
  common.run(main)
