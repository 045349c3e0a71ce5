"""External memory: ScaNN against exact search, and its cost in evaluation.

On a demo model of the character corpus (``configs/trime_enwik8.py:demo``
with ``data.corpus=text8`` by default: its training split gives about 1.5M
keys of d = 128), one run measures

* the datastore build (``--mode=datastore``): keys/s and bytes per key;
* the ScaNN index build, and top-K search (K = 1,024) of valid queries with
  ScaNN and with exact blockwise search: recall@K and queries/s, ratio;
* evaluation tokens/s of the same model with its external memory
  (``trime_ext``, ScaNN, K = 1,024) against plain evaluation.

    python benchmarks/external_memory.py --workdir=runs/bench_extmem \
        [--train_steps=200] [--queries=1024] [--eval_windows=40]

A workdir without a trained run gets one (``--train_steps`` of the demo
config); the datastore and index are built once and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import harness  # pylint: disable=g-import-not-at-top


def _config(args):
  config = harness.load_config(args.config)
  harness.apply_overrides(config, [f"data.corpus={args.corpus}", *args.set])
  config.train.num_steps = args.train_steps
  config.train.eval_every = 0
  config.train.checkpoint_every = args.train_steps
  config.eval_memory.kind = "trime_ext"
  config.eval_memory.ext_k = args.k
  config.datastore.recall_queries = args.queries
  return config


def _eval_rate(loaded, grid, external, windows: int) -> float:
  """Predictions/s of scoring the first ``windows`` valid windows."""
  from memjax.eval import memory_grid as em_lib  # pylint: disable=g-import-not-at-top

  c = loaded.settings

  def score(n):
    return em_lib.score_stream(
        loaded.model,
        loaded.params,
        loaded.splits["valid"],
        grid,
        window_len=c.eval.window_len,
        score_len=c.eval.score_len,
        batch_size=c.eval_memory.batch_size,
        mesh=loaded.mesh,
        unit=loaded.unit,
        max_windows=n,
        external=external,
        desc=f"bench {grid.kind}",
    )

  # Each call compiles its program again: the rate is taken from the
  # difference of a short and a long run, which cancels that fixed cost.
  runs = []
  for n in (max(1, windows // 4), windows):
    start = time.perf_counter()
    out = score(n)
    runs.append((out["plain"]["tokens"], time.perf_counter() - start))
  (t1, s1), (t2, s2) = runs
  return (t2 - t1) / max(s2 - s1, 1e-9)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add = parser.add_argument
  add("--config", default="configs/trime_enwik8.py:demo")
  add("--corpus", default="text8")
  add("--workdir", default="runs/bench_extmem")
  add("--train_steps", type=int, default=200)
  add("--k", type=int, default=1024)
  add("--queries", type=int, default=1024)
  add("--eval_windows", type=int, default=40)
  add("--set", action="append", default=[], metavar="KEY=VALUE")
  add("--out", default="")
  args = parser.parse_args()

  # pylint: disable=g-import-not-at-top
  from memjax import api
  from memjax import build
  from memjax import errors
  from memjax.checkpoints import runfiles
  from memjax.eval import external as external_lib
  from memjax.eval import grid as grid_lib
  from memjax.run import restore

  config = _config(args)
  w = args.workdir
  try:
    runfiles.find(w)
  except errors.MissingRunError:
    harness.log(f"training {args.train_steps} steps into {w}")
    api.train(config, w)
  run = build.build(config, w)
  loaded = restore.load_splits(run, splits=("valid",))
  scoring = loaded.scoring()
  store_path = external_lib.datastore_path(scoring, w)
  built = os.path.exists(os.path.join(store_path, "manifest.json"))
  ds = api.run_mode("datastore", config, w)
  index_dir = os.path.join(store_path, "index-dot_product")
  if not os.path.exists(os.path.join(index_dir, "index.json")):
    idx = api.run_mode("index", config, w)
  else:
    idx = {"seconds": None}
  rec = api.run_mode("recall", config, w)

  ext = external_lib.external_search(scoring, "dot_product", w)
  memories = run.parts.eval_memories
  grid = grid_lib.configured_grid(run.settings, memories)
  none = grid_lib.make(memories, "none")
  plain = _eval_rate(loaded, none, None, args.eval_windows)
  with_ext = _eval_rate(loaded, grid, ext, args.eval_windows)

  search = [
      {
          "name": "exact top-K (JAX, blockwise)",
          "recall": 1.0,
          "queries_per_s": rec["exact_queries_per_s"],
      },
      {
          "name": "ScaNN top-K (AH + exact re-order)",
          "recall": rec["recall"],
          "queries_per_s": rec["scann_queries_per_s"],
      },
  ]
  evals = [
      {"name": "plain evaluation", "tokens_per_s": plain},
      {"name": f"trime_ext, ScaNN K={args.k}", "tokens_per_s": with_ext},
  ]
  report = {
      "machine": harness.machine(),
      "config": args.config,
      "corpus": args.corpus,
      "keys": rec["keys"],
      "dim": ds.get("dim"),
      "k": args.k,
      "queries": rec["queries"],
      "datastore": {
          "keys_per_s": None if built else ds["keys"] / ds["seconds"],
          "bytes_per_key": ds.get("bytes_per_key"),
          "seconds": None if built else ds["seconds"],
      },
      "index_seconds": idx["seconds"],
      "search": search,
      "search_ratios": harness.ratios(search, ["queries_per_s"]),
      "eval": evals,
      "eval_ratios": harness.ratios(evals, ["tokens_per_s"]),
  }
  print(harness.format_table(search, ["recall", "queries_per_s"]))
  print(harness.format_table(evals, ["tokens_per_s"]))
  print(json.dumps(report, indent=2, default=str))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(report, f, indent=2, default=str)


if __name__ == "__main__":
  main()
