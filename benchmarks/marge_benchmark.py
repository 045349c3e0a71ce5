"""Modified MARGE: train step against the vanilla LM, and re-indexing time.

    python benchmarks/marge_benchmark.py [--size=demo] [--steps=10] \
        [--warmup=1] [--rounds=3] [--set=KEY=VALUE ...] [--out=FILE]

In one run: the vanilla LM of ``configs/marge_wt103.py:vanilla_SIZE`` (the
baseline: same layers and window of 2N tokens) and the MARGE model of
``marge_SIZE``, whose batches retrieve K sources from an index precomputed
with its initial parameters (exact or ScaNN, ``marge.search``). Reports
tokens/s, seconds per step and step memory as ratios against the baseline
(``benchmarks/harness.py``), plus the re-indexing time (embedding every
training segment with ``marge_index.embed_all``) per million segments and
the host's retrieval time per batch (not part of the timed step: batches
are built before the rounds, as the training loop prefetches them).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import harness  # pylint: disable=g-import-not-at-top

RATIO_KEYS = ("tokens_per_s", "seconds_per_step_median", "step_memory_bytes")
CONFIG = "configs/marge_wt103.py"


def _index(bench, batcher) -> dict[str, float]:
  """Builds the index with the bench's parameters; times it."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from memjax.methods.marge import reindex as marge_index  # pylint: disable=g-import-not-at-top

  table = batcher.table
  segments = table.segment_tokens(np.arange(len(table)))
  embed = lambda: marge_index.embed_all(
      bench.model, bench.state.params, segments, 256, bench.mesh
  )
  embed()  # compiles
  t0 = time.time()
  emb = embed()
  embed_s = time.time() - t0
  t0 = time.time()
  batcher.use_index(emb)
  build_s = time.time() - t0
  return dict(
      segments=len(table),
      reindex_s=embed_s + build_s,
      reindex_s_per_million_segments=(embed_s + build_s) * 1e6 / len(table),
      search_index_build_s=build_s,
  )


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", default="demo", help="smoke | demo | wt103")
  harness.add_timing_args(p, steps=10, warmup=1, rounds=3)
  args = p.parse_args(argv)
  specs = [f"{CONFIG}:vanilla_{args.size}", f"{CONFIG}:marge_{args.size}"]
  try:
    cfgs = [harness.load_config(s, args.set) for s in specs]
  except harness.ConfigError as e:
    p.error(str(e))
  benches, extra = [], {}
  with tempfile.TemporaryDirectory() as tmp:
    for spec, cfg in zip(specs, cfgs):
      harness.log(f"building {spec} ...")
      cfg.data.get("marge", {})["same_doc_steps"] = 0
      batcher, vocab_size = harness.load_corpus(cfg, tmp)
      first = harness.host_batches(batcher, 1)
      bench = harness.TrainBench(spec, cfg, vocab_size, first)
      if hasattr(batcher, "use_index"):
        extra = _index(bench, batcher)
        t0 = time.time()
        batches = harness.host_batches(batcher, max(args.steps, 1))
        extra["retrieval_s_per_batch"] = (time.time() - t0) / len(batches)
        bench.batches = [
            harness.sharding.put_global_batch(b, bench.mesh) for b in batches
        ]
      else:
        batches = harness.host_batches(batcher, max(args.steps, 1))
        bench.batches = [
            harness.sharding.put_global_batch(b, bench.mesh) for b in batches
        ]
      benches.append(bench)
  harness.run_rounds(
      benches, rounds=args.rounds, steps=args.steps, warmup=args.warmup
  )
  harness.finish(
      [b.result() for b in benches], args, ratio_keys=RATIO_KEYS, index=extra
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
