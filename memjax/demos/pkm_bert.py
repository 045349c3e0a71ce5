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
``results.json`` exists is read back, not run again.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/pkm_bert_demo", "Output directory."
)
_SIZE = flags.DEFINE_string("size", "demo", "Size of configs/pkm_bert.py.")
_ROWS = flags.DEFINE_list(
    "rows", ["a", "b", "c", "d", "e", "f"], "Rows (a-f, f_fresh)."
)
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Fine-tuning seeds (median).")
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
    "frozen_seeds", [], "Seeds of the frozen-memory fine-tunes (default:"
    " --seeds)."
)  # fmt: skip

# key: (row name, MLM method, row it starts from, fine-tuning method)
ROWS = {
    "a": ("(a) BERT, no memory", "vanilla", None, "cls"),
    "b": ("(b) (a) + extra steps", "vanilla", "a", "cls"),
    "c": ("(c) +PKM", "pkm", None, "cls_pkm"),
    "d": ("(d) +ResM", "resm", None, "cls_resm"),
    "e": ("(e) +Init +PKM", "init_pkm", "a", "cls_pkm"),
    "f": ("(f) +Init +ResM", "init_resm", "a", "cls_resm"),
    "f_fresh": ("(f') +Init +ResM, fresh FFN", "init_resm_fresh_ffn", "a",
                "cls_resm"),
}  # fmt: skip


def _run(config, workdir: str) -> dict:
  from memjax import train  # pylint: disable=g-import-not-at-top

  path = os.path.join(workdir, "results.json")
  if os.path.isfile(path):
    with open(path) as f:
      return json.load(f)
  start = time.time()
  res = train.train_and_evaluate(config, workdir)
  res["wall_s"] = time.time() - start
  with open(path, "w") as f:
    json.dump(res, f, indent=1)
  return res


def pretrain(key: str, root: str, size: str) -> dict:
  from configs import pkm_bert  # pylint: disable=g-import-not-at-top

  _, method, parent, _ = ROWS[key]
  c = pkm_bert.get_config(f"{method}_{size}")
  steps = (_EXTRA.value if parent else 0) or _STEPS.value
  if steps:
    c.train.num_steps = c.train.checkpoint_every = steps
    c.train.log_every = min(c.train.log_every, steps)
    c.optim.warmup_steps = steps // 10
  if parent:
    pretrain(parent, root, size)  # Read back when it has run.
    c.train.init_from = os.path.join(root, parent, "mlm")
  return _run(c, os.path.join(root, key, "mlm"))


def finetune(key: str, root: str, size: str, seed: int, frozen: bool) -> dict:
  from configs import pkm_bert  # pylint: disable=g-import-not-at-top

  method = ROWS[key][3] + ("_frozen" if frozen else "")
  c = pkm_bert.get_config(f"{method}_{size}")
  c.seed = seed
  c.train.init_from = os.path.join(root, key, "mlm")
  name = f"cls{'_frozen' if frozen else ''}_seed{seed}"
  return _run(c, os.path.join(root, key, name))


def summarise(key: str, mlm_res: dict, fts: list[dict]) -> dict:
  """One table row: MLM scores and the median fine-tune (by dev)."""
  row = {"key": key, "row": ROWS[key][0]}
  row["valid_ppl"] = mlm_res["valid"]["ppl"]
  row["test_ppl"] = mlm_res["test"]["ppl"]
  row["memory"] = mlm_res["valid"].get("memory", {})
  if fts:
    devs = [r["dev"]["accuracy"] for r in fts]
    med = statistics.median_low(devs)
    pick = fts[devs.index(med)]
    row.update(
        dev_acc=med, dev_accs=devs, test_acc=pick["test"]["accuracy"],
        ft_memory=pick.get("memory", {}),
        class_divergence=pick.get("class_divergence", {}),
    )  # fmt: skip
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


def format_table(rows: list[dict]) -> str:
  lines = [
      "| model | MLM ppl valid | MLM ppl test | top-1 MU (%) | KL_u | KL_w "
      "| sentiment dev acc (median) | test acc | top-1 MU after FT (%) "
      "| pos/neg KL | pos/neg IOU |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  pct = (
      lambda d, n: " / ".join(f"{100 * v[n]:.1f}" for _, v in sorted(d.items()))
      or "-"
  )
  for r in rows:
    lines.append(
        f"| {r['row']} | {r['valid_ppl']:.2f} | {r['test_ppl']:.2f} | "
        f"{pct(r['memory'], 'top1_mu')} | {_per_layer(r['memory'], 'kl_u')} | "
        f"{_per_layer(r['memory'], 'kl_w')} | "
        f"{_dev_cell(r)} | {r.get('test_acc', float('nan')):.4f} | "
        f"{pct(r.get('ft_memory', {}), 'top1_mu')} | "
        f"{_per_layer(r.get('class_divergence', {}), 'kl')} | "
        f"{_per_layer(r.get('class_divergence', {}), 'iou')} |"
    )
  return "\n".join(lines)


def format_frozen_table(rows: list[dict]) -> str:
  """Table 5: fine-tuning with the memory updated (Y) or held fixed (N)."""
  lines = [
      "| model | memory update | sentiment dev acc (median) | dev accs "
      "| test acc |",
      "|---|---|---:|---|---:|",
  ]
  for r in rows:
    if "frozen" not in r:
      continue
    for update, d in (("Y", r), ("N", r["frozen"])):
      accs = ", ".join(f"{a:.3f}" for a in d.get("dev_accs", []))
      lines.append(
          f"| {r['row']} | {update} | {d.get('dev_acc', float('nan')):.4f} "
          f"| {accs} | {d.get('test_acc', float('nan')):.4f} |"
      )
  return "\n".join(lines) if len(lines) > 2 else ""


def plot_curves(root: str, keys: list[str]) -> str:
  """figure3.png: MLM training perplexity against step, from the runs'
  ``train_log.jsonl`` (Kim & Jung's Figure 3, plus the control (b))."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6, 4))
  for key in keys:
    path = os.path.join(root, key, "mlm", "train_log.jsonl")
    if not os.path.isfile(path):
      continue
    steps, ppl = [], []
    with open(path) as f:
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
    ax.plot(steps, smooth, color=line.get_color(), label=ROWS[key][0])
  ax.set_xlabel("training step (after initialisation)")
  ax.set_ylabel("MLM training perplexity (moving average)")
  ax.set_yscale("log")
  ax.legend(fontsize=8)
  fig.tight_layout()
  out = os.path.join(root, "figure3.png")
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root, size = _WORKDIR.value, _SIZE.value
  unknown = [k for k in _ROWS.value if k not in ROWS]
  if unknown:
    raise app.UsageError(f"unknown --rows {unknown}; use {list(ROWS)}")
  # Parents first: (b), (e), (f) start from (a). Every pretraining, then
  # every fine-tune, then the frozen ones: a cut-short run keeps the most
  # important results, and a re-run reads back what exists.
  keys = sorted(_ROWS.value, key=lambda k: (ROWS[k][2] is not None, k))
  start = time.time()
  mlm = {}
  for key in keys:
    print(f"== {ROWS[key][0]}: pretraining ({time.time() - start:.0f}s)")
    mlm[key] = pretrain(key, root, size)
  # Seed-major: every row has its first seeds before any row its last.
  jobs = [(k, s, False) for s in _SEEDS.value for k in keys]
  frozen_seeds = _FROZEN_SEEDS.value or _SEEDS.value
  if _FROZEN.value:
    jobs += [(k, s, True) for s in frozen_seeds for k in keys
             if ROWS[k][3] != "cls"]  # fmt: skip
  fts = {}
  for key, seed, frozen in jobs:
    what = "frozen-memory fine-tuning" if frozen else "fine-tuning"
    print(f"== {ROWS[key][0]}: {what}, seed {seed} "
          f"({time.time() - start:.0f}s)")  # fmt: skip
    res = finetune(key, root, size, int(seed), frozen)
    fts.setdefault((key, frozen), []).append(res)
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
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "table.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(root, "table.json"), "w") as f:
    json.dump(rows, f, indent=1)
  # Every run that starts from (a) in the workdir, also one of an earlier
  # --rows; (b), the memory-less control, sees the same batches.
  fig = plot_curves(root, ["b", "e", "f", "f_fresh"])
  print(table)
  print(f"figure: {fig}; total {time.time() - start:.0f}s")


if __name__ == "__main__":
  app.run(main)
