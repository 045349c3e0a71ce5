"""The modified-MARGE demo: the vanilla LM and MARGE with the same steps.

    python -m memjax.marge_demo --workdir=runs/marge_demo

Trains ``vanilla_demo`` and ``demo`` of ``configs/marge_wt103.py`` (the same
layers, window of 2N tokens, steps and optimiser), runs
``--mode=position_loss`` on both and ``--mode=marge_eval`` on MARGE (the
documents are sections), and writes to ``--workdir``:

* ``table.md``, ``table.json``: perplexity on the standard sliding windows,
  MARGE's perplexity on the tokens of S_{t+1} with retrieval on and off,
  and the loss by position bucket of every row;
* ``position_loss.png``: the early-token plot (test split);
* ``vanilla/`` and ``marge/``: the runs and their mode outputs.

A run, or a mode's output, already in its directory is read back, not made
again, so the table can be rebuilt from finished runs.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

_WORKDIR = flags.DEFINE_string("workdir", "runs/marge_demo", "Output dir.")
SPLIT = "test"


def _config(variant: str):
  from configs import marge_wt103  # pylint: disable=g-import-not-at-top

  c = marge_wt103.get_config(variant)
  c.position_loss.documents = "sections"
  return c


def _once(path: str, make) -> dict:
  """The JSON at ``path``, made by ``make()`` when missing."""
  if not os.path.exists(path):
    make()
  with open(path) as f:
    return json.load(f)


def _rows(workdir: str) -> list[dict]:
  """Trains and evaluates both models (or reads them back)."""
  from memjax import train  # pylint: disable=g-import-not-at-top
  from memjax.modes import marge_eval  # pylint: disable=g-import-not-at-top
  from memjax.modes import position_loss  # pylint: disable=g-import-not-at-top

  rows = []
  for key, variant in (("vanilla", "vanilla_demo"), ("marge", "demo")):
    cfg, run = _config(variant), os.path.join(workdir, key)
    res = _once(
        os.path.join(run, "results.json"),
        lambda: train.train_and_evaluate(cfg, run),  # pylint: disable=cell-var-from-loop
    )
    pos = _once(
        os.path.join(run, "position_loss.json"),
        lambda: position_loss.position_loss(cfg, run),  # pylint: disable=cell-var-from-loop
    )
    row = dict(row=key, ppl=res[SPLIT]["ppl"], buckets=pos[SPLIT]["buckets"])
    if key == "marge":
      row["marge_eval"] = _once(
          os.path.join(run, "marge_eval.json"),
          lambda: marge_eval.marge_eval(cfg, run),  # pylint: disable=cell-var-from-loop
      )[SPLIT]
    rows.append(row)
  return rows


def format_table(rows: list[dict]) -> str:
  """Markdown: ppl and the loss per position bucket of each row."""
  labels = [b["bucket"] for b in rows[0]["buckets"]]
  head = f"| model | {SPLIT} ppl | " + " | ".join(labels) + " |"
  lines = [head, "|---|---:|" + "---:|" * len(labels)]

  def cells(buckets):
    return " | ".join(
        "-" if b["nll"] is None else f"{b['nll']:.3f}" for b in buckets
    )

  for r in rows:
    name = {"vanilla": "vanilla LM", "marge": "MARGE, retrieval off"}[r["row"]]
    lines.append(f"| {name} (all tokens) | {r['ppl']:.2f} | "
                 f"{cells(r['buckets'])} |")  # fmt: skip
  ev = next(r["marge_eval"] for r in rows if "marge_eval" in r)
  for key, name in (("retrieval", "on"), ("no_retrieval", "off")):
    e = ev[key]
    lines.append(f"| MARGE, retrieval {name} (S_t+1 tokens) | {e['ppl']:.2f} "
                 f"| {cells(e['buckets'])} |")  # fmt: skip
  return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
  """Loss by position bucket: one line per row."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  series = [(r["row"] + " (retrieval off)" if r["row"] == "marge" else
             r["row"], r["buckets"]) for r in rows]  # fmt: skip
  ev = next(r["marge_eval"] for r in rows if "marge_eval" in r)
  series.append(("marge, retrieval on (S_t+1)", ev["retrieval"]["buckets"]))
  series.append(("marge, retrieval off (S_t+1)", ev["no_retrieval"]["buckets"]))
  fig, ax = plt.subplots(figsize=(6, 3.6))
  for name, buckets in series:
    pts = [b for b in buckets if b["nll"] is not None]
    ax.plot([b["bucket"] for b in pts], [b["nll"] for b in pts], "o-",
            label=name)  # fmt: skip
  ax.set_xlabel("position in section")
  ax.set_ylabel(f"mean loss, {SPLIT} (nats)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv):
  del argv
  workdir = _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  rows = _rows(workdir)
  table = format_table(rows)
  with open(os.path.join(workdir, "table.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(workdir, "table.json"), "w") as f:
    json.dump(rows, f, indent=1)
  plot(rows, os.path.join(workdir, "position_loss.png"))
  print(table)


if __name__ == "__main__":
  app.run(main)
