"""``--mode=extrapolate``: recurrent models with longer memories (LaMemo, Figure 5).

``extrapolate(config, workdir)`` evaluates the latest checkpoint with
memories of ``m`` times the segment length for every m in
``config.extrapolate.ratios`` and writes ``extrapolation.csv``,
``extrapolation.json`` and ``extrapolation.png``. The memory length is not a
parameter, so one trained model is scored at every length.
"""

from __future__ import annotations

import csv
from typing import Any, Sequence

import ml_collections
import numpy as np
from jax.sharding import Mesh

from memjax.io import console
from memjax import errors
from memjax.io import paths
from memjax.eval import rows as rows_lib
from memjax.eval import streams


def write_csv(path: str, rows: Sequence[dict[str, Any]]) -> None:
  """Writes dict rows (same keys) as a CSV file."""
  with paths.open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def plot_extrapolation(
    path: str,
    curves: dict[str, Sequence[dict[str, Any]]],
    unit: str,
    title: str = "",
) -> None:
  """Plots metric against m = M / T, one line per model, into a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
  for name, rows in curves.items():
    ax.plot(
        [r["m"] for r in rows], [r[unit] for r in rows], marker="o", label=name
    )
  ax.set_xlabel("m = memory length / segment length")
  ax.set_ylabel(f"{rows[0]['split']} {unit}")
  ax.set_xticks([r["m"] for r in rows])
  if title:
    ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  paths.savefig(fig, path)
  plt.close(fig)


def extrapolation_rows(
    config: ml_collections.ConfigDict,
    model,
    params: Any,
    tokens: np.ndarray,
    mesh: Mesh,
    unit: str,
) -> list[dict[str, Any]]:
  """Evaluates with memory m * T for every m of ``config.extrapolate.ratios``."""
  seg = streams.segment_len_of(config)
  ratios = [int(m) for m in config.extrapolate.ratios]
  if not ratios or min(ratios) < 1:
    raise errors.ConfigError(
        f"extrapolate.ratios must be positive integers, got {ratios}"
    )
  out = []
  run = rows_lib.RunView(config, model, mesh, unit)
  for m in ratios:
    r = streams.StreamScorer(run, mem_len=m * seg).score(
        params,
        tokens,
        int(config.extrapolate.max_segments),
        desc=f"{config.extrapolate.split} m={m}",
    )
    out.append(
        {
            "m": m,
            "mem_len": m * seg,
            "segment_len": seg,
            "split": config.extrapolate.split,
            "nll": r["nll"],
            unit: r[unit],
            "tokens": int(r["tokens"]),
        }
    )
  return out


def extrapolate(
    config: ml_collections.ConfigDict, workdir: str
) -> dict[str, Any]:
  """``--mode=extrapolate``: the latest checkpoint with longer memories.

  Evaluates ``config.extrapolate.split`` with segments of ``eval.segment_len``
  (or ``data.seq_len``) T and memories of m * T for m in
  ``config.extrapolate.ratios``, and writes ``<workdir>/extrapolation.csv``
  (m, mem_len, segment_len, split, nll, ppl|bpc, tokens),
  ``extrapolation.json`` and ``extrapolation.png``.
  """
  from memjax import experiment  # pylint: disable=g-import-not-at-top

  restored, corpus = experiment.load_for_mode(config, workdir)
  split = config.extrapolate.split
  if split not in corpus.splits:
    raise errors.ConfigError(
        f"extrapolate.split {split!r} is not in eval.splits "
        f"{tuple(config.eval.splits)}"
    )
  rows = extrapolation_rows(
      config,
      restored.model,
      restored.variables,
      corpus.splits[split].tokens,
      restored.mesh,
      restored.unit,
  )
  files = {
      k: paths.join(workdir, f"extrapolation.{k}")
      for k in ("csv", "json", "png")
  }
  write_csv(files["csv"], rows)
  result = {
      "name": config.name,
      "step": restored.step,
      "rows": rows,
      "files": list(files.values()),
  }
  paths.write_json(files["json"], result, sort_keys=False)
  plot_extrapolation(
      files["png"],
      {config.name: rows},
      restored.unit,
      f"{config.name}, step {restored.step}",
  )
  for r in rows:
    console.info(
        "m=%d (memory %d): %s %.4f",
        r["m"],
        r["mem_len"],
        restored.unit,
        r[restored.unit],
    )
  return result
