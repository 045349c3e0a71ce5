"""Training speed and memory of TRIMELM, _long and _ext against vanilla.

    python benchmarks/trime_benchmark.py [--size=7m] [--seq_len=3072] \
        [--batch_size=8] [--methods=vanilla,trime,trime_long,trime_ext] \
        [--rounds=3] [--steps=1] [--warmup=1] [--set=model.remat=True ...] \
        [--out=FILE]

Builds the four methods of ``configs/trime_wt103.py`` at one size (default
the paper's 7M model: 8 layers, d = 128, L = 3072, 8 segments per update,
i.e. 24,576 in-batch memories) on a synthetic token stream with
WikiText-103's vocabulary size (267,735 types, Zipfian), so the adaptive
softmax has its real size. Everything else is the method's own config:
TRIMELM (local memory, random segments), TRIMELM_long (one block of 8
consecutive segments: the memory is the causal stream of all 24,576 tokens),
TRIMELM_ext (BM25-packed segments; every token sees all other segments).
The plain-LM warm-up is switched off (``trime.lm_warmup_fraction = 0``) so
every timed step computes the TRIME loss. ``--set`` overrides apply to
every method and are parsed like ``--config.KEY=VALUE`` of ``memjax.main``.

The methods run in one process and alternate within each round (the median
round is reported), so drifts in machine load hit all of them alike.
Vanilla always runs, first: it is the baseline. Memory is XLA's compiled
memory analysis of the train step (arguments + outputs + temporaries -
donated aliases), the same on every backend; on GPU/TPU the device's peak
bytes in use are reported too (cumulative over the process). Prints one
JSON object with the machine, per-method results and the ratios against
vanilla; the shared machinery is ``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import ml_collections  # pylint: disable=g-import-not-at-top
import numpy as np

from benchmarks import harness  # pylint: disable=g-import-not-at-top
from memjax import losses
from memjax.data import tasks

METHODS = ("vanilla", "trime", "trime_long", "trime_ext")
WT103_VOCAB = 267735
RATIO_KEYS = ("tokens_per_s", "seconds_per_step_median", "step_memory_bytes")


def zipf_stream(num_tokens: int, vocab: int, seed: int = 0) -> np.ndarray:
  """[N] int32 ids with Zipfian frequencies (id 0 most frequent)."""
  rng = np.random.default_rng(seed)
  p = 1.0 / np.arange(1, vocab + 1)
  return rng.choice(vocab, size=num_tokens, p=p / p.sum()).astype(np.int32)


def make_config(
    method: str, args: argparse.Namespace
) -> ml_collections.ConfigDict:
  """The method's config at ``args.size`` with the command line's changes."""
  cfg = harness.load_config(f"configs/trime_wt103.py:{method}_{args.size}")
  cfg.data.seq_len = args.seq_len or cfg.data.seq_len
  cfg.data.batch_size = args.batch_size or cfg.data.batch_size
  cfg.model.max_len = max(cfg.model.max_len, cfg.data.seq_len)
  cfg.train.grad_accum = 1
  if method == "trime_long":
    cfg.data.segments_per_lane = cfg.data.batch_size  # one lane: N = B * L
  return harness.apply_overrides(cfg, args.set)


def method_result(bench: harness.TrainBench) -> dict:
  """The harness's result plus the method's memory, batching and share."""
  cfg = bench.cfg
  aux = losses.summarize_aux(bench.last_metrics or {})
  return {
      **bench.result(),
      "loss_memory": cfg.trime.memory if cfg.loss.name == "trime" else None,
      "batching": cfg.data.batching,
      "in_batch_memories": bench.tokens_per_step,
      "memory_share": aux.get("memory_share"),
  }


def parse_args(
    argv: list[str] | None,
) -> tuple[argparse.Namespace, list[ml_collections.ConfigDict]]:
  """The command line, and the configs of its methods, vanilla first."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", default="7m")
  p.add_argument("--seq_len", type=int, default=0, help="0: the size's own")
  p.add_argument("--batch_size", type=int, default=0, help="0: the size's own")
  p.add_argument("--methods", default=",".join(METHODS))
  p.add_argument("--stream_tokens", type=int, default=1_000_000)
  harness.add_timing_args(p, steps=1, warmup=1, rounds=3)
  args = p.parse_args(argv)
  methods = args.methods.split(",")
  unknown = sorted(set(methods) - set(METHODS))
  if unknown:
    p.error(f"unknown methods {unknown}; use some of {METHODS}")
  args.methods = ["vanilla"] + [m for m in methods if m != "vanilla"]
  try:
    return args, [make_config(m, args) for m in args.methods]
  except harness.ConfigError as e:
    p.error(str(e))


def main(argv: list[str] | None = None) -> int:
  args, configs = parse_args(argv)
  stream = tasks.TokenStream(
      tokens=zipf_stream(args.stream_tokens, WT103_VOCAB),
      doc_starts=np.zeros(1, np.int64),
      vocab_size=WT103_VOCAB,
  )
  benches = []
  with tempfile.TemporaryDirectory() as tmp:
    for method, cfg in zip(args.methods, configs):
      harness.log(f"building {method} ...")
      batcher = harness.make_batcher(cfg, stream, tmp)
      batches = harness.host_batches(batcher, max(args.steps, 2))
      benches.append(
          harness.TrainBench(method, cfg, stream.vocab_size, batches)
      )
  harness.run_rounds(
      benches, rounds=args.rounds, steps=args.steps, warmup=args.warmup
  )
  results = [method_result(b) for b in benches]
  harness.finish(results, args, ratio_keys=RATIO_KEYS, size=args.size)
  return 0


if __name__ == "__main__":
  sys.exit(main())
