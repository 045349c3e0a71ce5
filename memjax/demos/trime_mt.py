"""The TRIMEMT_ext demo: Table 6's rows on the shipped German-English pairs.

    python -m memjax.demos.trime_mt --workdir=runs/demo_trime_mt

Trains ``configs/trime_iwslt.py:demo`` (vanilla: label smoothing over
``tokens`` batches) and ``trime_mt_demo`` (the ``trime_mt`` objective over
BM25-packed target batches) for the same number of updates (in two processes), builds each
model's datastore over the training targets (``--mode=mt_datastore``),
tunes K, lam and T on 200 valid sentences by teacher-forced NLL
(``--mode=mt_tune``), and scores the first 200 test sentences once with
beam 4 (``--test_sentences=0``: all 500): vanilla, vanilla +
kNN-MT, TRIMEMT_ext (joint softmax with its memory) and, for reference,
the TRIMEMT_ext model without memory. Every stage resumes from what the
workdir holds. The table lands in ``<workdir>/table.md`` / ``table.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/demo_trime_mt", "Output directory."
)
_STEPS = flags.DEFINE_integer("steps", 150, "Training updates of each model.")
_SIZE = flags.DEFINE_string("size", "demo", "configs/trime_iwslt.py size.")
_TEST = flags.DEFINE_integer(
    "test_sentences", 200, "Test sentences scored (0: all)."
)
_METHOD = flags.DEFINE_string(
    "method", "", "Run only this method (vanilla or trime_mt) into "
    "<workdir>/<method>/rows.json; empty: both, in two processes."
)  # fmt: skip


def _config(method: str, size: str, steps: int, data_dir: str = ""):
  from configs import trime_iwslt  # pylint: disable=g-import-not-at-top

  c = trime_iwslt.get_config(f"{method}_{size}")
  c.train.num_steps = int(steps)
  c.train.checkpoint_every = int(steps)
  # The end-of-training valid check: one decoding batch (64 sentences); a
  # second, smaller batch cost 5 min of the demo in recompilation and
  # decoding to the length limit by the undertrained models.
  c.translation.eval_max_sentences = 64
  if data_dir:
    c.data.data_dir = data_dir
  return c


def _row(scores: dict, **extra) -> dict:
  keep = ("bleu", "bleu_lowercase", "chrf", "decode_seconds")
  return {**{k: scores[k] for k in keep if k in scores}, **extra}


def run_method(method, workdir, size, steps, test_sentences, data_dir=""):
  """Trains one model, builds its memory, tunes, and scores test with and
  without the memory; returns its rows and timings."""
  # pylint: disable=g-import-not-at-top
  from memjax import experiment
  from memjax import train
  from memjax.methods.external import mt_modes as tm
  from memjax.tasks.translation import parts

  times = {}
  tic = time.time()
  trained = train.train_and_evaluate(
      _config(method, size, steps, data_dir), workdir
  )
  times["train"] = time.time() - tic
  config = _config(method, size, steps, data_dir)
  config.translation.split = "test"
  config.translation.eval_max_sentences = int(test_sentences)
  tic = time.time()
  built = tm.mt_datastore_mode(config, workdir)
  times["datastore_and_index"] = time.time() - tic
  tic = time.time()
  tuned = tm.mt_tune(config, workdir)
  times["tune"] = time.time() - tic
  restored = experiment.load(workdir, config=config)
  test = parts.read_split(
      config, "test", os.path.join(workdir, "spm.model"), workdir
  )
  tr = parts.make_translator(
      config, restored.model, restored.params, restored.vocab
  )
  plain = parts.score_split(tr, test, int(test_sentences), "test, no memory")
  tic = time.time()
  with_memory = tm.mt_translate(config, workdir)
  times["memory_decoding"] = time.time() - tic
  return {
      "config": config.name,
      "steps": trained["step"],
      "num_params": trained["num_params"],
      "keys": built["keys"],
      "tune": {k: tuned[k] for k in ("tokens", "nll_without_memory", "best")},
      "plain": _row(plain),
      "memory": _row(with_memory, settings=with_memory["settings"]),
      "signature": plain["bleu_signature"],
      "seconds": times,
  }


def _markdown(v: dict, t: dict, total: float) -> str:
  def line(name, s, nll):
    return (
        f"| {name} | {s['bleu']:.2f} | {s['bleu_lowercase']:.2f} | "
        f"{s['chrf']:.2f} | {nll} |"
    )

  def tuned(r):
    b = r["tune"]["best"]
    return f"{b['nll']:.3f}"

  plain_nll = f"{t['tune']['nll_without_memory']:.3f}"
  lines = [
      "| test, beam 4 | BLEU | lowercased BLEU | chrF | valid NLL "
      "(teacher-forced) |",
      "|---|---|---|---|---|",
      line("vanilla", v["plain"], f"{v['tune']['nll_without_memory']:.3f}"),
      line("vanilla + kNN-MT", v["memory"], tuned(v)),
      line("TRIMEMT_ext", t["memory"], tuned(t)),
      line("(TRIMEMT_ext model, no memory)", t["plain"], plain_nll),
      "",
      "kNN-MT: " + _settings(v["memory"]["settings"], "knn"),
      "TRIMEMT_ext: " + _settings(t["memory"]["settings"], "trime"),
      f"datastores: {v['keys']:,} / {t['keys']:,} target positions; "
      f"{v['steps']} updates each; {v['num_params']:,} parameters; "
      f"total {total:.0f} s",
      f"BLEU signature: {v['signature']}",
  ]
  return "\n".join(lines)


def _settings(s: dict, kind: str) -> str:
  if kind == "knn":
    return (
        f"k={s['k']}, lambda={s['knn_lambda']}, T={s['knn_temperature']} "
        "(squared L2)"
    )
  lam = f"lambda={s['lambda']} (tuned)" if s["interpolate"] else "lambda = mass"
  return f"k={s['k']}, tau={s['temperature']} (inner product), {lam}"


def _child(method: str, workdir: str, size, steps, test) -> subprocess.Popen:
  log = open(os.path.join(workdir, f"{method}.log"), "w")  # pylint: disable=consider-using-with
  return subprocess.Popen(
      [
          sys.executable, "-m", "memjax.demos.trime_mt", f"--method={method}",
          f"--workdir={workdir}", f"--size={size}", f"--steps={steps}",
          f"--test_sentences={test}",
      ],
      stdout=log, stderr=subprocess.STDOUT,
  )  # fmt: skip


def run(workdir: str, size: str = "demo", steps: int = 150, test=200):
  """Both models' rows, the two methods in parallel processes (each is
  one core's work for most of its run); writes table.json and table.md."""
  start = time.time()
  os.makedirs(workdir, exist_ok=True)
  children = {
      m: _child(m, workdir, size, steps, test) for m in ("vanilla", "trime_mt")
  }
  rows = {}
  for m, proc in children.items():
    if proc.wait() != 0:
      raise RuntimeError(
          f"the {m} part failed; see {os.path.join(workdir, m + '.log')}"
      )
    with open(os.path.join(workdir, m, "rows.json")) as f:
      rows[m] = json.load(f)
  total = time.time() - start
  table = {
      **rows,
      "total_seconds": total,
      "markdown": _markdown(rows["vanilla"], rows["trime_mt"], total),
  }
  from memjax import runfiles  # pylint: disable=g-import-not-at-top

  return runfiles.write_table(workdir, table)


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from memjax import errors  # pylint: disable=g-import-not-at-top

  try:
    if _METHOD.value:
      sub = os.path.join(_WORKDIR.value, _METHOD.value)
      rows = run_method(
          _METHOD.value, sub, _SIZE.value, _STEPS.value, _TEST.value
      )
      with open(os.path.join(sub, "rows.json"), "w") as f:
        json.dump(rows, f, indent=2)
      return
    table = run(_WORKDIR.value, _SIZE.value, _STEPS.value, _TEST.value)
  except errors.UserError as e:
    print(f"memjax: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(table["markdown"])


if __name__ == "__main__":
  app.run(main)
