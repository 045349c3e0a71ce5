"""Training speed and memory of TRIMELM, TRIMELM_long, TRIMELM_ext against vanilla.

    python benchmarks/trime_benchmark.py [--size=7m] [--seq_len=3072] \
        [--batch_size=8] [--rounds=3] [--steps=1] [--set=model.remat=True]

Builds the four methods of ``configs/trime_wt103.py`` at one size (default
the paper's 7M model: 8 layers, d = 128, L = 3072, 8 segments per update,
i.e. 24,576 in-batch memories) on a synthetic token stream with
WikiText-103's vocabulary size (267,735 types, Zipfian), so the adaptive
softmax has its real size. Everything else is the method's own config:
TRIMELM (local memory, random segments), TRIMELM_long (one block of 8
consecutive segments: the memory is the causal stream of all 24,576 tokens),
TRIMELM_ext (BM25-packed segments; every token sees all other segments).
The plain-LM warm-up is switched off so every timed step computes the TRIME
loss.

The methods run in one process and alternate within each round (the median
round is reported), so drifts in machine load hit all of them alike. Memory
is XLA's compiled memory analysis of the train step (arguments + outputs +
temporaries - donated aliases), the same on every backend; on GPU/TPU the
device's peak bytes in use are printed too (cumulative over the process).
Prints one JSON object with the machine, per-method results and the ratios
against vanilla.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from configs import trime_wt103  # pylint: disable=g-import-not-at-top
from memjax import losses
from memjax import optim
from memjax import sharding as sharding_lib
from memjax import train
from memjax.data import tasks

METHODS = ("vanilla", "trime", "trime_long", "trime_ext")
WT103_VOCAB = 267735


def cpu_model() -> str:
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  return platform.processor() or platform.machine()


def machine() -> dict:
  dev = jax.devices()[0]
  return {
      "platform": dev.platform,
      "device_kind": dev.device_kind,
      "device_count": jax.device_count(),
      "cpu": cpu_model(),
      "cpu_count": os.cpu_count(),
      "jax": jax.__version__,
      "python": platform.python_version(),
  }


def zipf_stream(num_tokens: int, vocab: int, seed: int = 0) -> np.ndarray:
  """[N] int32 ids with Zipfian frequencies (id 0 most frequent)."""
  rng = np.random.default_rng(seed)
  p = 1.0 / np.arange(1, vocab + 1)
  return rng.choice(vocab, size=num_tokens, p=p / p.sum()).astype(np.int32)


def apply_overrides(cfg, overrides):
  for item in overrides:
    key, _, value = item.partition("=")
    node = cfg
    *parents, leaf = key.split(".")
    for p in parents:
      node = getattr(node, p)
    old = getattr(node, leaf)
    if isinstance(old, bool):
      value = value.lower() in ("1", "true", "yes")
    setattr(node, leaf, type(old)(value))
  return cfg


class Runner:
  """One method's compiled train step, state and batches."""

  def __init__(
      self, method: str, args, stream: tasks.TokenStream, cache_dir: str
  ):
    cfg = trime_wt103.get_config(f"{method}_{args.size}")
    cfg.data.seq_len = args.seq_len or cfg.data.seq_len
    cfg.data.batch_size = args.batch_size or cfg.data.batch_size
    cfg.model.max_len = max(cfg.model.max_len, cfg.data.seq_len)
    cfg.train.grad_accum = 1
    cfg.loss.lm_warmup_fraction = 0.0
    if method == "trime_long":
      cfg.data.segments_per_lane = cfg.data.batch_size  # one lane: N = B * L
    apply_overrides(cfg, args.set)
    self.method, self.cfg = method, cfg
    mesh = sharding_lib.make_mesh(cfg.mesh.to_dict())
    model = train.build_model(cfg.model, stream.vocab_size)
    tx, _ = optim.make_optimizer(cfg.optim, cfg.train.num_steps)
    loss_fn = losses.make_loss(cfg.loss, cfg.train.num_steps, seed=cfg.seed)
    batcher = train.make_batcher(cfg, stream, cache_dir)
    sample = train.host_batch(batcher, 0)
    self.state, shardings = train.create_state(
        model, tx, mesh, sample, jax.random.PRNGKey(0)
    )
    self.step = train.make_train_step(
        model, tx, loss_fn, grad_accum=1, state_shardings=shardings, mesh=mesh
    )
    self.batches = [
        sharding_lib.put_global_batch(train.host_batch(batcher, i), mesh)
        for i in range(max(args.steps, 2))
    ]
    self.rng = jax.random.PRNGKey(1)
    self.num_params = int(
        sum(np.prod(x.shape) for x in jax.tree.leaves(self.state.params))
    )
    t0 = time.time()
    self.memory_bytes = self.step.memory_bytes(
        self.state, self.batches[0], self.rng
    )
    self.run(1)
    self.warmup_s = time.time() - t0
    self.times: list[float] = []

  def run(self, steps: int) -> float:
    t0 = time.time()
    for i in range(steps):
      self.state, m = self.step(
          self.state, self.batches[i % len(self.batches)], self.rng
      )
    jax.block_until_ready(m)
    self.last = jax.device_get(m)
    return (time.time() - t0) / steps

  def report(self) -> dict:
    sps = float(np.median(self.times))
    tokens = self.cfg.data.batch_size * self.cfg.data.seq_len
    aux = losses.summarize_aux(self.last)
    return {
        "method": self.method,
        "config": self.cfg.name,
        "loss_memory": self.cfg.loss.memory
        if self.cfg.loss.name == "trime"
        else None,
        "batching": self.cfg.data.batching,
        "in_batch_memories": tokens,
        "seconds_per_step_median": sps,
        "seconds_per_step_all_rounds": self.times,
        "tokens_per_s": tokens / sps,
        "compile_and_first_step_s": self.warmup_s,
        "num_params": self.num_params,
        "step_memory_bytes": self.memory_bytes,
        "memory_share": aux.get("memory_share"),
        "loss": float(self.last["loss"]),
    }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", default="7m")
  p.add_argument("--seq_len", type=int, default=0, help="0: the size's own")
  p.add_argument("--batch_size", type=int, default=0, help="0: the size's own")
  p.add_argument("--methods", default=",".join(METHODS))
  p.add_argument("--steps", type=int, default=1, help="steps per round")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--stream_tokens", type=int, default=1_000_000)
  p.add_argument(
      "--set",
      action="append",
      default=[],
      help="key=value override applied to every method",
  )
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  methods = args.methods.split(",")
  if methods[0] != "vanilla":
    methods = ["vanilla"] + [m for m in methods if m != "vanilla"]
  stream = tasks.TokenStream(
      tokens=zipf_stream(args.stream_tokens, WT103_VOCAB),
      doc_starts=np.zeros(1, np.int64),
      vocab_size=WT103_VOCAB,
  )
  import tempfile  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as tmp:
    runners = []
    for m in methods:
      print(f"building {m} ...", file=sys.stderr, flush=True)
      runners.append(Runner(m, args, stream, tmp))
  for r in range(args.rounds):
    for runner in runners:
      runner.times.append(runner.run(args.steps))
    print(
        f"round {r + 1}/{args.rounds}: "
        + ", ".join(f"{x.method} {x.times[-1]:.2f}s/step" for x in runners),
        file=sys.stderr,
        flush=True,
    )
  results = [x.report() for x in runners]
  base = results[0]
  for r in results:
    r["speed_ratio_vs_vanilla"] = r["tokens_per_s"] / base["tokens_per_s"]
    r["slowdown_percent"] = 100.0 * (
        base["tokens_per_s"] / r["tokens_per_s"] - 1.0
    )
    r["memory_ratio_vs_vanilla"] = (
        r["step_memory_bytes"] / base["step_memory_bytes"]
    )
  stats = jax.devices()[0].memory_stats() or {}
  report = {
      "machine": machine(),
      "size": args.size,
      "overrides": args.set,
      "device_peak_bytes_in_process": stats.get("peak_bytes_in_use"),
      "results": results,
  }
  text = json.dumps(report, indent=2)
  print(text)
  print(
      "\nmethod        tokens/s   vs vanilla   step memory (MB)   vs vanilla",
      file=sys.stderr,
  )
  for r in results:
    print(
        f"{r['method']:12s} {r['tokens_per_s']:9.0f}   {r['speed_ratio_vs_vanilla']:9.3f}"
        f"   {r['step_memory_bytes'] / 2**20:16.1f}   {r['memory_ratio_vs_vanilla']:9.3f}",
        file=sys.stderr,
    )
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
