"""The rows of the TRIME demo: what each row trains and tunes, and the table.

Rows (Tables 2-3 of the TRIME paper, at demo scale), each pair of a
baseline and a TRIME model reading the same memories at evaluation:

* vanilla: the plain LM objective, evaluated without memory;
* vanilla + continuous cache: the vanilla checkpoint with Grave et al.'s
  cache over the local memory only (N = 0; Table 2's row, "use the local
  memory at testing time", §2.2), lambda and theta tuned on valid;
* TRIMELM: the TRIME loss with local memory, evaluated with M_local (tau
  tuned on valid);
* vanilla + continuous cache (long): the cache extended to a long-term
  memory (footnote 5, Figure 3), tuned over TRIMELM_long's grid of N;
* TRIMELM_long: the TRIME loss with long-term in-batch memory (random blocks
  of consecutive segments), evaluated with M_local u M_long (tau and the
  memory size tuned on valid).

``memjax/demos/trime.py`` runs the rows; this module holds no flags so it
can be tested by itself.
"""

from __future__ import annotations

from typing import Any

import memjax
from memjax.io import paths
from memjax.demos import common

# Variants of configs/trime_wt103.py. options: "memory", the memory kind tuned
# at evaluation; "long_mem_grid", its sizes N (a tuple, or the name of the
# variant whose grid it takes); base: the row whose checkpoint it evaluates
# instead of training.
ROWS = (
    common.Row("vanilla", "vanilla", "trime_wt103", "demo"),
    common.Row(
        "vanilla + continuous cache",
        "vanilla + continuous cache",
        "trime_wt103",
        "demo",
        base="vanilla",
        options={"memory": "cache", "long_mem_grid": (0,)},
    ),
    common.Row(
        "TRIMELM",
        "TRIMELM",
        "trime_wt103",
        "trime_demo",
        options={"memory": "trime"},
    ),
    common.Row(
        "vanilla + continuous cache (long)",
        "vanilla + continuous cache (long)",
        "trime_wt103",
        "demo",
        base="vanilla",
        options={"memory": "cache", "long_mem_grid": "trime_long_demo"},
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
      "model",
      "params",
      "steps",
      "memory at evaluation",
      "valid ppl",
      "test ppl",
      "test ppl without memory",
      "train tokens/s",
  ]
  body = [
      [
          r["row"],
          f"{r['num_params']:,}",
          r["step"],
          _setting(r),
          f"{r['valid']['ppl']:.2f}",
          f"{r['test']['ppl']:.2f}",
          f"{r['test_plain']['ppl']:.2f}",
          common.tokens_per_s(r),
      ]
      for r in rows
  ]
  body.append(
      [common.UNIGRAM, "-", "-", "-", *common.unigram(rows, "ppl"), "-", "-"]
  )
  return common.markdown(head, "lrrlrrrr", body)


def tuned_memory(demo: common.Demo, row: common.Row, cfg: Any) -> None:
  """Sets ``cfg.eval_memory``'s kind and grid of N to the row's (in place)."""
  cfg.eval_memory.kind = row.options["memory"]
  grid = row.options.get("long_mem_grid")
  if isinstance(grid, str):  # the grid of another variant of the config
    grid = demo.config(row.config, grid).eval_memory.long_mem_grid
  if grid is not None:
    cfg.eval_memory.long_mem_grid = tuple(grid)


def run_row(demo: common.Demo, row: common.Row, steps: int | None) -> dict:
  """Trains (or reads back) one row's model and tunes its memory again;
  returns the row (also written to its directory's ``row.json``)."""
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
  if "memory" in row.options:
    tuned_memory(demo, row, cfg)
    em = cfg.eval_memory
    print(
        f"== {row.label}: tune the {em.kind} memory on valid "
        f"(N in {tuple(em.long_mem_grid) or (em.long_mem_tokens,)})",
        flush=True,
    )
    tuned = memjax.run_mode("tune", cfg, row_dir)
    res.update(
        valid=tuned["valid"]["memory"],
        test=tuned["test"]["memory"],
        best=tuned["best"],
        grid_valid=tuned["grid_valid"],
    )
    if row.base:
      res.pop("train_tokens_per_s", None)
  paths.makedirs(row_dir)
  paths.write_json(paths.join(row_dir, "row.json"), res)
  return res
