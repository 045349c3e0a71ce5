"""LaMemo vs Transformer-XL vs Transformer+RPE: step time, memory, FLOPs.

    python benchmarks/recurrence_benchmark.py [--size=demo] [--steps=10] \
        [--warmup=2] [--rounds=3] [--batch=N] [--models=lamemo,xl,rpe] \
        [--set=model.dtype=bfloat16 ...] [--out=FILE]

Builds the three models of ``configs/txl_wt103.py`` and
``configs/lamemo_wt103.py`` at one size (same layers, widths, segment and
memory lengths, batch) and, in one run, measures for each:

* training step time (jitted train step of the training loop, the state
  donated, the memory carried from step to step; compilation excluded); the
  models alternate within each round and the median round is reported, so
  drifts in machine load hit all of them alike;
* memory: XLA's compiled estimate of one step (arguments + outputs +
  temporaries - aliased); the device's peak bytes in use where the runtime
  reports them (GPU, TPU; not CPU) are reported once for the whole run;
* FLOPs per token from XLA's cost analysis of the compiled programs: the
  forward pass (the paper's "FLOPs for one step prediction", Table 1), the
  forward pass without the output softmax (the part where the models
  differ), and the whole train step (forward, backward, optimiser).

The adaptive softmax computes every cluster for every position (static
shapes), so its share of the FLOPs grows with the vocabulary and shrinks the
LaMemo / Transformer-XL ratio; at the paper's size (vocabulary 267,735,
full-width clusters) it is the larger part, as in the paper's counts.

Batches are random tokens of the configured vocabulary (``--vocab``, default
267,735: WikiText-103's; the demo corpus's 12,907 at the smoke and demo
sizes), so no corpus is read and the paper's sizes run as they are.
``--set`` overrides apply to every model and are parsed like
``--config.KEY=VALUE`` of ``memjax.main``. Prints one JSON object with
ratios against Transformer-XL (the baseline, run first) and the machine it
ran on; the shared machinery is ``benchmarks/harness.py``. The paper counts
191M (LaMemo) against 157M (Transformer-XL) forward FLOPs per token, 1.22x,
and 148M for Transformer+RPE.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import ml_collections  # pylint: disable=g-import-not-at-top
import numpy as np

from benchmarks import harness  # pylint: disable=g-import-not-at-top
from configs import txl_wt103

WT103_VOCAB = 267735
# Config of each model at a size; Transformer-XL first: the baseline.
MODELS = {
    "xl": "configs/txl_wt103.py:txl_{size}",
    "lamemo": "configs/lamemo_wt103.py:{size}",
    "rpe": "configs/txl_wt103.py:rpe_{size}",
}
RATIO_KEYS = (
    "seconds_per_step_median",
    "forward_flops_per_token",
    "body_flops_per_token",
    "train_step_flops_per_token",
    "step_memory_bytes",
)
PAPER = {
    "forward_flops_per_token": {"lamemo": 191e6, "xl": 157e6, "rpe": 148e6},
    "target_step_time_ratio_lamemo_vs_xl": 1.25,
}


def flops_of(compiled: Any) -> float:
  """XLA's FLOP count of a compiled program (dict or list of dicts)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return float((cost or {}).get("flops", float("nan")))


def make_config(
    name: str, size: str, overrides: list[str], batch: int
) -> ml_collections.ConfigDict:
  """The model's config at ``size``: plain LM loss, one segment per lane."""
  cfg = harness.load_config(MODELS[name].format(size=size), overrides)
  if batch:
    cfg.data.batch_size = batch
  cfg.data.segments_per_lane = 1
  cfg.loss.name = "lm"
  return cfg


def random_batches(
    cfg: ml_collections.ConfigDict, vocab: int, count: int, seed: int = 0
) -> list[dict[str, np.ndarray]]:
  """Random tokens; the memory is reset on the first batch only."""
  rng = np.random.default_rng(seed)
  b, l = cfg.data.batch_size, cfg.data.seq_len
  out = []
  for i in range(count):
    toks = rng.integers(0, vocab, (b, l + 1)).astype(np.int32)
    out.append(
        {
            "inputs": toks[:, :-1],
            "targets": toks[:, 1:],
            "reset": np.full(b, i == 0),
        }
    )
  return out


def flops_per_token(bench: harness.TrainBench) -> dict[str, float]:
  """XLA's FLOPs per token: forward, forward without softmax, train step."""
  model = bench.model

  def forward(params, batch, memory):
    out = model.apply(
        {"params": params},
        batch["inputs"],
        batch["targets"],
        memory=memory,
        deterministic=True,
    )
    return out.target_logprob, out.memory

  def body(params, batch, memory):
    return model.apply(
        {"params": params},
        batch["inputs"],
        memory,
        deterministic=True,
        method=lambda mdl, x, mem, **kw: mdl.hidden_states(x, mem, **kw),
    )

  args = (bench.state.params, bench.batches[0], bench.state.memory)
  tokens = bench.tokens_per_step
  return {
      "forward_flops_per_token": flops_of(bench.compile(forward, *args))
      / tokens,
      "body_flops_per_token": flops_of(bench.compile(body, *args)) / tokens,
      "train_step_flops_per_token": flops_of(bench.compile()) / tokens,
  }


def parse_args(
    argv: list[str] | None,
) -> tuple[argparse.Namespace, list[ml_collections.ConfigDict]]:
  """The command line, and the configs of its models, xl first."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", default="demo", choices=txl_wt103.SIZES)
  p.add_argument("--batch", type=int, default=0, help="override batch size")
  p.add_argument(
      "--vocab",
      type=int,
      default=0,
      help="vocabulary size (default: WikiText-103's; 259 bytes "
      "for enwik8 and text8)",
  )
  p.add_argument(
      "--models",
      default="lamemo,xl,rpe",
      help="some of xl, lamemo, rpe; xl runs first and is the baseline",
  )
  harness.add_timing_args(
      p,
      steps=10,
      warmup=2,
      rounds=3,
      steps_help="timed steps per model and round; 0 = FLOPs and memory "
      "estimates only (no step is run: for sizes too large for the machine)",
  )
  args = p.parse_args(argv)
  wanted = args.models.split(",")
  unknown = sorted(set(wanted) - set(MODELS))
  if unknown:
    p.error(f"unknown models {unknown}; use some of {list(MODELS)}")
  args.models = [m for m in MODELS if m in wanted]
  try:
    configs = [
        make_config(m, args.size, args.set, args.batch) for m in args.models
    ]
  except harness.ConfigError as e:
    p.error(str(e))
  return args, configs


def default_vocab(size: str) -> int:
  """WikiText-103's vocabulary, the demo corpus's, or bytes."""
  if size in ("smoke", "demo"):
    return 12907  # The demo corpus's vocabulary (cut-offs 2000, 6000).
  return 259 if size in ("enwik8", "text8") else WT103_VOCAB


def main(argv: list[str] | None = None) -> int:
  args, configs = parse_args(argv)
  vocab = args.vocab or default_vocab(args.size)
  count = max(args.steps, args.warmup, 1)
  benches, flops = [], []
  for name, cfg in zip(args.models, configs):
    harness.log(f"building {name} ...")
    batches = random_batches(cfg, vocab, count)
    bench = harness.TrainBench(name, cfg, vocab, batches)
    benches.append(bench)
    flops.append(flops_per_token(bench))
  harness.run_rounds(
      benches, rounds=args.rounds, steps=args.steps, warmup=args.warmup
  )
  results = []
  for bench, f in zip(benches, flops):
    m, d = bench.cfg.model, bench.cfg.data
    results.append(
        {
            **bench.result(),
            "attention": m.attention,
            "mem_len": m.mem_len,
            "seq_len": d.seq_len,
            "batch_size": d.batch_size,
            **f,
        }
    )
  harness.finish(
      results,
      args,
      ratio_keys=RATIO_KEYS,
      size=args.size,
      vocab=vocab,
      paper=PAPER,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
