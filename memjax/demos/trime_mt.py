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

import os
import subprocess
import sys
import time
from typing import Any

from absl import flags

import memjax
from memjax.io import paths
from memjax.demos import common

FLAGS = common.define_flags(
    "runs/demo_trime_mt",
    steps="Training updates of each model.",
    steps_default=150,
)
_SIZE = flags.DEFINE_string("size", "demo", "configs/trime_iwslt.py size.")
_TEST = flags.DEFINE_integer(
    "test_sentences", 200, "Test sentences scored (0: all)."
)
_METHOD = flags.DEFINE_string(
    "method",
    "",
    "Run only this method (vanilla or trime_mt) into "
    "<workdir>/<method>/rows.json; empty: both, in two processes.",
)


def _config(method: str, size: str, steps: int, data_dir: str = "") -> Any:
  c = common.load_config("trime_iwslt", f"{method}_{size}")
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
  from memjax import dispatch
  from memjax.tasks import config as task_config
  from memjax.tasks.translation import parts

  times = {}
  tic = time.time()
  trained = common.train(_config(method, size, steps, data_dir), workdir)
  times["train"] = time.time() - tic
  config = _config(method, size, steps, data_dir)
  config.translation.split = "test"
  config.translation.eval_max_sentences = int(test_sentences)
  tic = time.time()
  built = memjax.run_mode("mt_datastore", config, workdir)
  times["datastore_and_index"] = time.time() - tic
  tic = time.time()
  tuned = memjax.run_mode("mt_tune", config, workdir)
  times["tune"] = time.time() - tic
  restored = dispatch.restore(workdir, config=config)
  s = restored.settings
  test = parts.read_split(s, "test", paths.join(workdir, "spm.model"), workdir)
  tr = parts.make_translator(
      s.of(task_config.Translation),
      restored.model,
      restored.variables,
      restored.vocab,
  )
  plain = parts.score_split(tr, test, int(test_sentences), "test, no memory")
  tic = time.time()
  with_memory = memjax.run_mode("mt_translate", config, workdir)
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
    return [
        name,
        *(f"{s[k]:.2f}" for k in ("bleu", "bleu_lowercase", "chrf")),
        nll,
    ]

  def tuned(r):
    return f"{r['tune']['best']['nll']:.3f}"

  table = common.markdown(
      [
          "test, beam 4",
          "BLEU",
          "lowercased BLEU",
          "chrF",
          "valid NLL (teacher-forced)",
      ],
      "lllll",
      [
          line("vanilla", v["plain"], f"{v['tune']['nll_without_memory']:.3f}"),
          line("vanilla + kNN-MT", v["memory"], tuned(v)),
          line("TRIMEMT_ext", t["memory"], tuned(t)),
          line(
              "(TRIMEMT_ext model, no memory)",
              t["plain"],
              f"{t['tune']['nll_without_memory']:.3f}",
          ),
      ],
  )
  lines = [
      table,
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
  # A local file: the subprocess writes its output into it.
  log = open(os.path.join(workdir, f"{method}.log"), "w")  # pylint: disable=consider-using-with
  return subprocess.Popen(
      [
          sys.executable,
          "-m",
          "memjax.demos.trime_mt",
          f"--method={method}",
          f"--workdir={workdir}",
          f"--size={size}",
          f"--steps={steps}",
          f"--test_sentences={test}",
      ],
      stdout=log,
      stderr=subprocess.STDOUT,
  )


def run(workdir: str, size: str = "demo", steps: int = 150, test=200):
  """Both models' rows, the two methods in parallel processes (each is
  one core's work for most of its run); writes table.json and table.md and
  prints the table."""
  demo = common.Demo(workdir)
  children = {
      m: _child(m, workdir, size, steps, test) for m in ("vanilla", "trime_mt")
  }
  rows = {}
  for m, proc in children.items():
    if proc.wait() != 0:
      raise RuntimeError(
          f"the {m} part failed; see {paths.join(workdir, m + '.log')}"
      )
    rows[m] = common.read_json(paths.join(workdir, m, "rows.json"))
  total = time.time() - demo.start
  return demo.finish(
      {**rows, "total_seconds": total},
      _markdown(rows["vanilla"], rows["trime_mt"], total),
  )


def main() -> None:
  if _METHOD.value:
    sub = paths.join(FLAGS.workdir.value, _METHOD.value)
    rows = run_method(
        _METHOD.value, sub, _SIZE.value, FLAGS.steps.value, _TEST.value
    )
    paths.write_json(paths.join(sub, "rows.json"), rows)
    return
  run(FLAGS.workdir.value, _SIZE.value, FLAGS.steps.value, _TEST.value)


if __name__ == "__main__":
  common.run(main)
