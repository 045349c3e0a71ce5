"""The demo: TRIME against vanilla and the continuous cache on the demo corpus.

    python -m memjax.demos.trime --workdir=runs/demo

Rows (Tables 2-3 of the TRIME paper, at demo scale):

* vanilla: the plain LM objective, evaluated without memory;
* vanilla + continuous cache: the vanilla checkpoint with Grave et al.'s
  cache over the local and long-term memory (lambda, theta and the memory
  size tuned on valid);
* TRIMELM: the TRIME loss with local memory, evaluated with M_local (tau
  tuned on valid);
* TRIMELM_long: the TRIME loss with long-term in-batch memory (random blocks
  of consecutive segments), evaluated with M_local u M_long (tau and the
  memory size tuned on valid).

Every trained row trains the same number of steps on the same model and
batch size; test is scored once, at the setting chosen on valid. The table
lands in ``<workdir>/table.md`` and ``<workdir>/table.json``. A row whose
workdir already holds a run finished with the same steps is read back and
only its memory tuned again, so an interrupted demo continues where it
stopped.
"""

from __future__ import annotations

from typing import Any

from memjax import paths
from memjax.demos import common

FLAGS = common.define_flags(
    "runs/demo", rows="Subset of rows to run (default: all)."
)

# Variants of configs/trime_wt103.py; "memory": the memory kind tuned at
# evaluation; base: the row whose checkpoint it evaluates instead of training.
ROWS = (
    common.Row("vanilla", "vanilla", "trime_wt103", "demo"),
    common.Row(
        "vanilla + continuous cache",
        "vanilla + continuous cache",
        "trime_wt103",
        "demo",
        base="vanilla",
        options={"memory": "cache"},
    ),
    common.Row(
        "TRIMELM",
        "TRIMELM",
        "trime_wt103",
        "trime_demo",
        options={"memory": "trime"},
    ),
    common.Row(
        "TRIMELM_long",
        "TRIMELM_long",
        "trime_wt103",
        "trime_long_demo",
        options={"memory": "trime"},
    ),
)


def _setting(r: dict[str, Any]) -> str:
  best = r.get("best")
  if not best:
    return "-"
  parts = []
  if "long_mem_tokens" in best:
    parts.append(f"N={best['long_mem_tokens']}")
  if "temperature" in best:
    parts.append(f"tau={best['temperature']:g}")
  if "cache_theta" in best:
    parts.append(
        f"theta={best['cache_theta']:g}, lambda={best['cache_lambda']:g}"
    )
  return ", ".join(parts)


def format_table(rows: list[dict[str, Any]]) -> str:
  """Markdown table of valid/test perplexity per row."""
  head = [
      "model", "params", "steps", "memory at evaluation", "valid ppl",
      "test ppl", "test ppl without memory", "train tokens/s",
  ]  # fmt: skip
  body = [
      [
          r["row"], f"{r['num_params']:,}", r["step"], _setting(r),
          f"{r['valid']['ppl']:.2f}", f"{r['test']['ppl']:.2f}",
          f"{r['test_plain']['ppl']:.2f}", common.tokens_per_s(r),
      ]  # fmt: skip
      for r in rows
  ]
  body.append(
      [common.UNIGRAM, "-", "-", "-", *common.unigram(rows, "ppl"), "-", "-"]
  )
  return common.markdown(head, "lrrlrrrr", body)


def run_row(demo: common.Demo, row: common.Row, steps: int | None) -> dict:
  """Trains (or reads back) one row's model and evaluates it; returns the
  row (also written to its directory's ``row.json``)."""
  from memjax import runfiles  # pylint: disable=g-import-not-at-top
  from memjax.modes import memory as memory_modes  # pylint: disable=g-import-not-at-top

  cfg = demo.config(row.config, row.variant, steps)
  row_dir = demo.run_dir(row)
  if row.base:
    res = dict(common.read_json(paths.join(demo.run_dir(row.base), "row.json")))
    cfg.train.init_from = demo.run_dir(row.base)
  else:
    print(
        f"== {row.label}: train {cfg.name}, {cfg.train.num_steps} steps",
        flush=True,
    )
    res = common.train(cfg, row_dir)
  res.update(row=row.label, test_plain=res["test"], valid_plain=res["valid"])
  kind = row.options.get("memory")
  if kind is not None:
    cfg.eval_memory.kind = kind
    print(f"== {row.label}: tune the {kind} memory on valid", flush=True)
    tuned = memory_modes.tune(cfg, row_dir)
    res.update(
        valid=tuned["valid"]["memory"],
        test=tuned["test"]["memory"],
        best=tuned["best"],
        grid_valid=tuned["grid_valid"],
    )
    if row.base:
      res.pop("train_tokens_per_s", None)
  runfiles.write_json(paths.join(row_dir, "row.json"), res)
  return res


def main() -> None:
  common.run_rows(FLAGS, ROWS, run_row, format_table, about="WikiText format")


if __name__ == "__main__":
  common.run(main)
