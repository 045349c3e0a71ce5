"""The PKM-in-BERT demo: Kim & Jung's Table 2 rows on the demo corpus,
then sentiment fine-tuning of each.

    python -m memjax.demos.pkm_bert --workdir=runs/pkm_bert_demo

Masked-LM pretraining (``configs/pkm_bert.py``, demo size) of

* (a) no memory; (b) (a) trained the same extra steps again (the control);
* (c) PKM and (d) ResM from scratch, as many steps as (a);
* (e) PKM and (f) ResM initialised from (a), as many extra steps as (b);
* optionally (f') ResM from (a) with the memory layers' FFN re-initialised
  (``--rows`` with ``f_fresh``; Figure 3's ResM').

Each row is scored on the valid and test windows (MLM perplexity; top-1 MU,
KL_u, KL_w per memory layer over the valid split), then fine-tuned on the
shipped sentiment set once per ``--seeds`` seed (median dev accuracy; test
accuracy at the best dev step; usage and positive-vs-negative top-1 KL and
IOU per layer after fine-tuning). ``--frozen`` adds the fine-tunes with the
memory held fixed (Table 5). Writes ``table.md``, ``table.json`` and
``figure3.png`` (MLM training curves of the initialised rows, from their
``train_log.jsonl``) to ``--workdir``, one directory per run; a run whose
``results.json`` shows it finished its steps is read back, not run again.
"""

from __future__ import annotations

import json
import math
import statistics
import time

from absl import flags

from memjax.io import paths
from memjax.demos import common
from memjax.demos import pkm_bert_rows

FLAGS = common.define_flags(
    "runs/pkm_bert_demo",
    rows="Rows (a-f, f_fresh).",
    rows_default=["a", "b", "c", "d", "e", "f"],
    steps=None,
)
_SIZE = flags.DEFINE_string("size", "demo", "Size of configs/pkm_bert.py.")
_SEEDS = flags.DEFINE_list(
    "seeds", list(pkm_bert_rows.DEFAULT_SEEDS), "Fine-tuning seeds (median)."
)
_STEPS = flags.DEFINE_integer(
    "mlm_steps", 0, "Pretraining steps per stage (0 = the config's)."
)
_EXTRA = flags.DEFINE_integer(
    "extra_steps",
    0,
    "Steps of the rows that start from (a): (b), (e), (f)"
    " (0 = --mlm_steps or the config's).",
)
_FROZEN = flags.DEFINE_bool("frozen", False, "Also fine-tune frozen memory.")
_FROZEN_SEEDS = flags.DEFINE_list(
    "frozen_seeds",
    [],
    "Seeds of the frozen-memory fine-tunes (default:" " --seeds).",
)


ROWS = pkm_bert_rows.ROWS


def pretrain(key: str, root: str, size: str) -> dict:
  """Masked-LM pretraining of row ``key`` (and of the row it starts from),
  or the results of a finished run."""
  row = ROWS[key]
  c = common.load_config(row.config, f"{row.variant}_{size}")
  steps = (_EXTRA.value if row.base else 0) or _STEPS.value
  if steps:
    c.train.num_steps = c.train.checkpoint_every = steps
    c.train.log_every = min(c.train.log_every, steps)
    c.optim.warmup_steps = steps // 10
  if row.base:
    pretrain(row.base, root, size)  # Read back when it has run.
    c.train.init_from = pkm_bert_rows.mlm_dir(root, row.base)
  return common.train(c, pkm_bert_rows.mlm_dir(root, key))


def finetune(key: str, root: str, size: str, seed: int, frozen: bool) -> dict:
  """Sentiment fine-tuning of row ``key``'s MLM with ``seed``."""
  method = ROWS[key].options["finetune"] + ("_frozen" if frozen else "")
  c = common.load_config("pkm_bert", f"{method}_{size}")
  c.seed = seed
  c.train.init_from = pkm_bert_rows.mlm_dir(root, key)
  return common.train(c, pkm_bert_rows.finetune_dir(root, key, seed, frozen))


def summarise(key: str, mlm_res: dict, fts: list[dict]) -> dict:
  """One table row: MLM scores and the median fine-tune (by dev)."""
  row = {"key": key, "row": ROWS[key].label}
  row["valid_ppl"] = mlm_res["valid"]["ppl"]
  row["test_ppl"] = mlm_res["test"]["ppl"]
  row["memory"] = mlm_res["valid"].get("memory", {})
  if fts:
    devs = [r["dev"]["accuracy"] for r in fts]
    med = statistics.median_low(devs)
    pick = fts[devs.index(med)]
    row.update(
        dev_acc=med,
        dev_accs=devs,
        test_acc=pick["test"]["accuracy"],
        ft_memory=pick.get("memory", {}),
        class_divergence=pick.get("class_divergence", {}),
    )
  return row


def _per_layer(d: dict, name: str, fmt: str = "{:.3f}") -> str:
  return " / ".join(fmt.format(v[name]) for _, v in sorted(d.items())) or "-"


def _dev_cell(r: dict) -> str:
  """The median dev accuracy, with the seeds' range when there are several."""
  cell = f"{r.get('dev_acc', float('nan')):.4f}"
  accs = r.get("dev_accs", [])
  if len(accs) > 1:
    cell += f" ({min(accs):.3f}-{max(accs):.3f})"
  return cell


def _pct(d: dict, name: str) -> str:
  return " / ".join(f"{100 * v[name]:.1f}" for _, v in sorted(d.items())) or "-"


def format_table(rows: list[dict]) -> str:
  """Table 2 and the fine-tunes: one line per row."""
  nan = float("nan")
  body = [
      [
          r["row"],
          f"{r['valid_ppl']:.2f}",
          f"{r['test_ppl']:.2f}",
          _pct(r["memory"], "top1_mu"),
          _per_layer(r["memory"], "kl_u"),
          _per_layer(r["memory"], "kl_w"),
          _dev_cell(r),
          f"{r.get('test_acc', nan):.4f}",
          _pct(r.get("ft_memory", {}), "top1_mu"),
          _per_layer(r.get("class_divergence", {}), "kl"),
          _per_layer(r.get("class_divergence", {}), "iou"),
      ]
      for r in rows
  ]
  head = [
      "model",
      "MLM ppl valid",
      "MLM ppl test",
      "top-1 MU (%)",
      "KL_u",
      "KL_w",
      "sentiment dev acc (median)",
      "test acc",
      "top-1 MU after FT (%)",
      "pos/neg KL",
      "pos/neg IOU",
  ]
  return common.markdown(head, "l" + "r" * 10, body)


def format_frozen_table(rows: list[dict]) -> str:
  """Table 5: fine-tuning with the memory updated (Y) or held fixed (N)."""
  nan = float("nan")
  body = [
      [
          r["row"],
          update,
          f"{d.get('dev_acc', nan):.4f}",
          ", ".join(f"{a:.3f}" for a in d.get("dev_accs", [])),
          f"{d.get('test_acc', nan):.4f}",
      ]
      for r in rows
      if "frozen" in r
      for update, d in (("Y", r), ("N", r["frozen"]))
  ]
  if not body:
    return ""
  head = [
      "model",
      "memory update",
      "sentiment dev acc (median)",
      "dev accs",
      "test acc",
  ]
  return common.markdown(head, "llrlr", body)


def plot_curves(root: str, keys: list[str]) -> str:
  """figure3.png: MLM training perplexity against step, from the runs'
  ``train_log.jsonl`` (Kim & Jung's Figure 3, plus the control (b))."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6, 4))
  for key in keys:
    path = paths.join(pkm_bert_rows.mlm_dir(root, key), "train_log.jsonl")
    if not paths.isfile(path):
      continue
    steps, ppl = [], []
    with paths.open(path) as f:
      for line in f:
        d = json.loads(line)
        if "loss" in d and math.isfinite(d["loss"]):
          steps.append(d["step"])
          ppl.append(math.exp(min(d["loss"], 30.0)))
    # One batch's ~300 masked tokens make the per-step values noisy: the
    # raw curve is drawn faint, a centred moving average over it.
    line = ax.plot(steps, ppl, alpha=0.25, linewidth=0.8)[0]
    w = max(1, len(ppl) // 10)
    smooth = [
        math.exp(
            statistics.fmean(
                math.log(v) for v in ppl[max(0, i - w // 2) : i + w // 2 + 1]
            )
        )
        for i in range(len(ppl))
    ]
    ax.plot(steps, smooth, color=line.get_color(), label=ROWS[key].label)
  ax.set_xlabel("training step (after initialisation)")
  ax.set_ylabel("MLM training perplexity (moving average)")
  ax.set_yscale("log")
  ax.legend(fontsize=8)
  fig.tight_layout()
  out = paths.join(root, "figure3.png")
  paths.savefig(fig, out, dpi=100)
  plt.close(fig)
  return out


def _finetunes(keys: list[str], root: str, start: float) -> dict:
  """Every fine-tune of the rows ``keys``: {(key, frozen): [results]}."""
  # Seed-major: every row has its first seeds before any row its last.
  jobs = [(k, s, False) for s in _SEEDS.value for k in keys]
  frozen_seeds = _FROZEN_SEEDS.value or _SEEDS.value
  if _FROZEN.value:
    jobs += [
        (k, s, True)
        for s in frozen_seeds
        for k in keys
        if ROWS[k].options["finetune"] != "cls"
    ]
  fts = {}
  for key, seed, frozen in jobs:
    what = "frozen-memory fine-tuning" if frozen else "fine-tuning"
    print(
        f"== {ROWS[key].label}: {what}, seed {seed} "
        f"({time.time() - start:.0f}s)"
    )
    res = finetune(key, root, _SIZE.value, int(seed), frozen)
    fts.setdefault((key, frozen), []).append(res)
  return fts


def main() -> None:
  demo = common.Demo(FLAGS.workdir.value)
  root = demo.workdir
  # Parents first: (b), (e), (f) start from (a). Every pretraining, then
  # every fine-tune, then the frozen ones: a cut-short run keeps the most
  # important results, and a re-run reads back what exists.
  selected = common.select(list(ROWS.values()), FLAGS.rows.value)
  keys = [r.key for r in sorted(selected, key=lambda r: (bool(r.base), r.key))]
  mlm = {}
  for key in keys:
    print(
        f"== {ROWS[key].label}: pretraining "
        f"({time.time() - demo.start:.0f}s)"
    )
    mlm[key] = pretrain(key, root, _SIZE.value)
  fts = _finetunes(keys, root, demo.start)
  rows = []
  for key in keys:
    row = summarise(key, mlm[key], fts.get((key, False), []))
    if (key, True) in fts:
      row["frozen"] = summarise(key, mlm[key], fts[(key, True)])
    rows.append(row)
  table = format_table(rows)
  frozen_table = format_frozen_table(rows)
  if frozen_table:
    table += "\n\nFine-tuning with the memory held fixed (Table 5):\n\n"
    table += frozen_table
  # Every run that starts from (a) in the workdir, also one of an earlier
  # --rows; (b), the memory-less control, sees the same batches.
  fig = plot_curves(root, ["b", "e", "f", "f_fresh"])
  demo.finish({"rows": rows}, table)
  print(f"figure: {fig}; total {time.time() - demo.start:.0f}s")


if __name__ == "__main__":
  common.run(main)
