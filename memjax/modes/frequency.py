"""Perplexity by frequency bucket (TRIME paper, Table 14).

Tokens are grouped by how often their type occurs (in the development set, as
the paper's text says, or in the training set); each bucket's perplexity is
exp of the mean negative log-likelihood of the predictions whose target falls
in it.

    python -m memjax.modes.frequency runs/vanilla runs/trime runs/trime_long

prints one Table 14-style markdown table from the ``buckets.json`` files that
``--mode=buckets`` wrote in those run directories.
"""

from __future__ import annotations

import math
import sys
from typing import Mapping, Sequence

import numpy as np

from memjax.io import paths


def _short(n: int) -> str:
  return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def bucket_labels(edges: Sequence[int]) -> list[str]:
  """Labels of the len(edges) + 1 buckets, most frequent first."""
  edges = list(edges)
  labels = [f"> {_short(edges[0])}"]
  for hi, lo in zip(edges[:-1], edges[1:]):
    labels.append(f"{_short(lo)}-{_short(hi)}")
  labels.append(f"<= {_short(edges[-1])}")
  return labels


def bucket_of(counts: np.ndarray, edges: Sequence[int]) -> np.ndarray:
  """[V] int bucket of each token id: 0 for count > edges[0], ..., last for
  count <= edges[-1].

  Raises:
    ValueError: edges not strictly decreasing.
  """
  edges = np.asarray(edges, np.int64)
  if edges.size == 0 or np.any(np.diff(edges) >= 0):
    raise ValueError(
        f"bucket edges must be strictly decreasing, got {edges.tolist()}"
    )
  # Number of edges a count is <= to: count > e0 -> 0, e1 < count <= e0 -> 1, ...
  return np.sum(np.asarray(counts)[:, None] <= edges[None, :], axis=1)


def bucket_table(
    targets: np.ndarray,
    columns: Mapping[str, np.ndarray],
    counts: np.ndarray,
    edges: Sequence[int],
) -> list[dict]:
  """Perplexity of each column's log-probabilities per frequency bucket.

  Args:
    targets: [P] int target of every prediction.
    columns: name -> [P] float log-probabilities of the targets.
    counts: [V] int occurrences of each token type.
    edges: decreasing bucket edges, e.g. (10000, 1000, 100, 10).

  Returns:
    One row per bucket and a final 'avg' row: {'bucket', 'tokens', name: ppl}.
  """
  which = bucket_of(counts, edges)[np.asarray(targets)]
  rows = []
  for b, label in enumerate(bucket_labels(edges) + ["avg"]):
    mask = which == b if label != "avg" else np.ones_like(which, bool)
    row = {"bucket": label, "tokens": int(mask.sum())}
    for name, logp in columns.items():
      lp = np.asarray(logp, np.float64)[mask]
      row[name] = float(math.exp(-lp.mean())) if lp.size else float("nan")
    rows.append(row)
  return rows


def markdown(rows: Sequence[Mapping], title: str = "") -> str:
  """Table 14 layout: one line per model, one column per bucket."""
  names = [k for k in rows[0] if k not in ("bucket", "tokens")]
  head = "| model | " + " | ".join(r["bucket"] for r in rows) + " |"
  lines = [head, "|---|" + "---:|" * len(rows)]
  lines.append(
      "| tokens | " + " | ".join(f"{r['tokens']:,}" for r in rows) + " |"
  )
  for n in names:
    label = f"{title}: {n}" if title else n
    lines.append(
        f"| {label} | " + " | ".join(f"{r[n]:.2f}" for r in rows) + " |"
    )
  return "\n".join(lines)


def merge(run_dirs: Sequence[str]) -> str:
  """One markdown table from several runs' buckets.json."""
  lines: list[str] = []
  for d in run_dirs:
    res = paths.read_json(paths.join(d, "buckets.json"))
    table = markdown(res["rows"], title=res.get("name", paths.basename(d)))
    body = table.splitlines()
    lines = body if not lines else lines + body[3:]
  return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
  if len(argv) < 2:
    print(__doc__.strip().splitlines()[0], file=sys.stderr)
    print(
        "usage: python -m memjax.modes.frequency RUN_DIR [RUN_DIR ...]",
        file=sys.stderr,
    )
    return 2
  print(merge(argv[1:]))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
