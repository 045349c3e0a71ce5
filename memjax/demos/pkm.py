"""The product-key memory demo: the memory-less LM, PKM, ResM and Memory+.

    python -m memjax.demos.pkm --workdir=runs/pkm_demo

Trains the ``demo``, ``pkm_demo``, ``resm_demo`` and ``memory_plus_demo``
variants of ``configs/pkm_wt103.py`` on the shipped demo corpus (the same
model, steps and data order each; memory layers 2 and 3 of 4 with 128^2
slots), evaluates them, and runs ``--mode=memory_usage`` over the valid
split on the memory models. Writes to ``--workdir``:

* ``table.md``, ``table.json``: valid / test perplexity, parameters,
  training tokens/s, and per memory layer MU, top-1 MU, KL_u, KL_w;
* one directory per row with that run's checkpoints, results,
  ``memory_usage.json`` and ``memory_usage.png``.

A row whose directory already holds a run finished with the same steps
(and its usage, for a memory model) is read back, not run again; rows can
run in separate processes (``--rows``) and a last call makes the table.
"""

from __future__ import annotations

from typing import Any

import memjax
from memjax.io import paths
from memjax.demos import common

FLAGS = common.define_flags(
    "runs/pkm_demo", rows="Subset of rows (vanilla, pkm, resm, memory_plus)."
)

ROWS = (
    common.Row("vanilla", "Transformer (no memory)", "pkm_wt103", "demo"),
    common.Row("pkm", "PKM (memory replaces FFN)", "pkm_wt103", "pkm_demo"),
    common.Row("resm", "ResM (FFN + memory)", "pkm_wt103", "resm_demo"),
    common.Row(
        "memory_plus",
        "Memory+ (gated memory replaces FFN)",
        "pkm_wt103",
        "memory_plus_demo",
    ),
)


def run_row(demo: common.Demo, row: common.Row, steps: int | None) -> dict:
  """Trains (or reads back) one row and, for a memory model, its usage."""
  cfg = demo.config(row.config, row.variant, steps)
  if steps:
    cfg.train.eval_every = cfg.train.checkpoint_every = steps
  print(f"== {row.label}: {cfg.name}, {cfg.train.num_steps} steps", flush=True)
  run = demo.run_dir(row)
  res = common.train(cfg, run)
  if cfg.model.feed_forward != "ffn":
    usage = common.once(
        paths.join(run, "memory_usage.json"),
        lambda: memjax.run_mode("memory_usage", cfg, run),
    )
    res["usage"] = usage["layers"]
  res.update(row=row.label, key=row.key)
  return res


def format_table(rows: list[dict[str, Any]]) -> str:
  """Markdown table: one line per model and memory layer."""
  unit = rows[0]["unit"]
  body = []
  for r in rows:
    cells = [
        r["row"],
        f"{r['num_params']:,}",
        f"{r['valid'][unit]:.2f}",
        f"{r['test'][unit]:.2f}",
        common.tokens_per_s(r),
    ]
    for layer, m in (r.get("usage") or {"-": None}).items():
      if m is None:
        body.append(cells + ["-"] * 5)
      else:
        body.append(
            cells
            + [layer.split("/")[0]]
            + [f"{m[k]:.3f}" for k in ("mu", "top1_mu", "kl_u", "kl_w")]
        )
      cells = [""] * 5
  body.append(
      [common.UNIGRAM, "-", *common.unigram(rows, unit), "-"] + [""] * 5
  )
  head = [
      "model",
      "params",
      f"valid {unit}",
      f"test {unit}",
      "train tokens/s",
      "memory layer",
      "MU",
      "top-1 MU",
      "KL_u",
      "KL_w",
  ]
  return common.markdown(head, "lrrrrlrrrr", body)


if __name__ == "__main__":
  common.run(lambda: common.run_rows(FLAGS, ROWS, run_row, format_table))
