"""The modified-MARGE demo: the early-token table of MARGE and its rivals.

    python -m memjax.demos.marge --workdir=runs/marge_demo \\
        [--rows=vanilla,marge,txl,trime_long,knn,pkm]

By default trains ``vanilla_demo`` and ``demo`` of ``configs/marge_wt103.py``
(the same layers, window of 2N tokens, steps and optimiser), runs
``--mode=position_loss`` on both and ``--mode=marge_eval`` on MARGE (the
documents are sections). ``--rows`` adds Transformer-XL, TRIMELM_long, the
kNN-LM (the vanilla run, its datastore and index) and a PKM LM, each a
demo-size run of its own config with the vanilla row's steps and training
tokens (``memjax/demos/marge_rows.py``). Writes to ``--workdir``:

* ``table.md``, ``table.json``: parameters, training tokens, each run's own
  test perplexity, the perplexity over the sections (context reset at each
  section), MARGE's perplexity on the tokens of S_{t+1} with retrieval on
  and off, and the loss by position bucket of every row;
* ``position_loss.png``: the early-token plot (test split);
* ``<row>/``: the runs and their mode outputs.

A run, or a mode's output, already in its directory is read back, not made
again, so the table can be rebuilt from finished runs.
"""

from __future__ import annotations


from typing import Any

import memjax
from memjax.io import paths
from memjax.demos import common
from memjax.demos import marge_rows

FLAGS = common.define_flags(
    "runs/marge_demo",
    rows="Comma-separated rows of the table: vanilla, marge, txl, "
    "trime_long, knn, pkm (the default fits about 15 minutes of two idle CPU "
    "cores).",
    rows_default=["vanilla", "marge"],
    steps=None,
)
SPLIT = marge_rows.SPLIT


def _knn_memory(cfg: Any, run: str) -> None:
  """The datastore of the training split and its ScaNN index (once), in
  ``eval_memory.datastore`` (``<run>/datastore`` by default, as
  ``--mode=datastore`` places it)."""
  # pylint: disable=g-import-not-at-top
  from memjax import build
  from memjax.memory import search

  other = cfg.datastore.corpus
  name = f"datastore-{other}" if other else "datastore"
  path = cfg.eval_memory.datastore or paths.join(run, name)
  if not paths.exists(paths.join(path, "manifest.json")):
    memjax.run_mode("datastore", cfg, run)
  kind = build.parts().eval_memories.get(cfg.eval_memory.kind)
  if not paths.isdir(search.index_dir(path, kind.external_metric)):
    memjax.run_mode("index", cfg, run)


def _row(workdir: str, name: str) -> dict:
  """Trains and scores row ``name`` (or reads its files back)."""
  spec = marge_rows.ROWS[name]
  run = paths.join(workdir, name)
  base = paths.join(workdir, spec.base or name)
  cfg = marge_rows.row_config(name, base)
  res = common.train(cfg, base)
  if spec.options.get("eval_memory", {}).get("kind") == "knn":
    _knn_memory(cfg, run)
  pos = common.once(
      paths.join(run, "position_loss.json"),
      lambda: memjax.run_mode("position_loss", cfg, run),
  )
  row = marge_rows.make_row(name, cfg, res, pos)
  if name == "marge":
    row["marge_eval"] = common.once(
        paths.join(run, "marge_eval.json"),
        lambda: memjax.run_mode("marge_eval", cfg, run),
    )[SPLIT]
  return row


def plot(rows: list[dict], path: str) -> None:
  """Loss by position bucket: one line per row."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(7, 4.2))
  for name, buckets in marge_rows.plot_series(rows):
    pts = [b for b in buckets if b["nll"] is not None]
    style = "o--" if "S_t+1" in name else "o-"
    ax.plot(
        [b["bucket"] for b in pts], [b["nll"] for b in pts], style, label=name
    )
  ax.set_xlabel("position in section")
  ax.set_ylabel(f"mean loss, {SPLIT} (nats)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  paths.savefig(fig, path, dpi=100)
  plt.close(fig)


def main() -> None:
  demo = common.Demo(FLAGS.workdir.value)
  names = marge_rows.parse_rows(",".join(FLAGS.rows.value))
  rows = [_row(demo.workdir, name) for name in names]
  plot(rows, paths.join(demo.workdir, "position_loss.png"))
  demo.finish({"rows": rows}, marge_rows.format_table(rows))


if __name__ == "__main__":
  common.run(main)
