"""``--mode=extrapolate``: recurrent models with longer memories (LaMemo, Figure 5).

``extrapolate(run)`` evaluates the latest checkpoint with memories of
``m`` times the segment length for every m in ``extrapolate.ratios``
(``config.Extrapolate``) and writes ``extrapolation.csv``,
``extrapolation.json`` and ``extrapolation.png``. The memory length is not a
parameter, so one trained model is scored at every length.
"""

from __future__ import annotations

import csv
from typing import Any, Sequence

import numpy as np

from memjax import errors
from memjax.data import corpus as corpus_lib
from memjax.eval import rows as rows_lib
from memjax.eval import streams
from memjax.io import console
from memjax.io import paths
from memjax.methods.recurrent import config as recurrent_config
from memjax.run import restore
from memjax.run import spec


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
    scoring: rows_lib.Scoring,
    e: recurrent_config.Extrapolate,
    params: Any,
    tokens: np.ndarray,
) -> list[dict[str, Any]]:
  """Evaluates the scoring's model with memory m * T for every m of the
  ``extrapolate`` settings ``e`` (T its evaluation segment length)."""
  seg = int(scoring.segment_len)
  unit = scoring.unit
  ratios = [int(m) for m in e.ratios]
  if not ratios or min(ratios) < 1:
    raise errors.ConfigError(
        f"extrapolate.ratios must be positive integers, got {ratios}"
    )
  out = []
  for m in ratios:
    r = streams.StreamScorer(scoring, mem_len=m * seg).score(
        params,
        tokens,
        int(e.max_segments),
        desc=f"{e.split} m={m}",
    )
    out.append(
        {
            "m": m,
            "mem_len": m * seg,
            "segment_len": seg,
            "split": e.split,
            "nll": r["nll"],
            unit: r[unit],
            "tokens": int(r["tokens"]),
        }
    )
  return out


def extrapolate(run: spec.Run) -> dict[str, Any]:
  """``--mode=extrapolate``: the latest checkpoint with longer memories.

  Evaluates ``extrapolate.split`` with segments of ``eval.segment_len``
  (or ``data.seq_len``) T and memories of m * T for m in
  ``extrapolate.ratios``, and writes ``<workdir>/extrapolation.csv``
  (m, mem_len, segment_len, split, nll, ppl|bpc, tokens),
  ``extrapolation.json`` and ``extrapolation.png``.
  """
  s, workdir = run.settings, run.workdir
  e = s.of(recurrent_config.Extrapolate)
  restored = restore.restore_source(run)
  corpus = corpus_lib.load_corpus(s.data, s.eval, workdir, train=False)
  split = e.split
  if split not in corpus.splits:
    raise errors.ConfigError(
        f"extrapolate.split {split!r} is not in eval.splits "
        f"{tuple(s.eval.splits)}"
    )
  rows = extrapolation_rows(
      restored.scoring(), e, restored.variables, corpus.splits[split].tokens
  )
  files = {
      k: paths.join(workdir, f"extrapolation.{k}")
      for k in ("csv", "json", "png")
  }
  write_csv(files["csv"], rows)
  result = {
      "name": s.name,
      "step": restored.step,
      "rows": rows,
      "files": list(files.values()),
  }
  paths.write_json(files["json"], result, sort_keys=False)
  plot_extrapolation(
      files["png"],
      {s.name: rows},
      restored.unit,
      f"{s.name}, step {restored.step}",
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
