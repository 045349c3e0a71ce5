"""Product-key memory speed: PKM and ResM LMs against the memory-less one.

    python benchmarks/pkm_benchmark.py [--size=demo] [--steps=5] \
        [--warmup=1] [--rounds=3] [--set=KEY=VALUE ...] [--out=FILE]

Builds, at one size of ``configs/pkm_wt103.py``, the memory-less model (the
baseline), the same with two PKM layers, with two ResM layers, and the
memory-less model with twice the layers, and measures in one run (the
models alternate within rounds, the median round is kept):

* inference at batch 1 (Kim & Jung's Table 1 protocol: one sequence of
  ``data.seq_len`` tokens per call, the jitted forward pass with scores);
* a training step (the training loop's jitted step, state donated; the
  values trained by lazy Adam as the configs train them);
* the memory layer alone against a dense FFN (D -> F -> D) with the same
  parameter count, forward and backward over one training batch's tokens;
* the optimiser step of one values table: lazy Adam against optax's Adam,
  with the gradient of one training batch's reads.

Batches are random tokens of the demo vocabulary (12,907). ``--size=base``
is BERT-base's shape (12 layers, d 768, 12 heads, FFN 3072, memory layers
{4, 8}, 512^2 slots), for machines that can run it. Prints one JSON object
with ratios against the memory-less model and the machine; the shared
machinery is ``benchmarks/harness.py``. Kim & Jung: BERT-base 79.8 batch/s,
+PKM 61.4 (0.77x), +ResM 59.3 (0.74x), BERT-large 43.1 (0.54x); our goal is
>= 0.85x the memory-less model.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from benchmarks import harness  # pylint: disable=g-import-not-at-top

VOCAB = 12907
MODELS = ("none", "pkm", "resm", "double")
PAPER = {
    "bert_base_batches_per_s": 79.8,
    "pkm_vs_base": 0.77,
    "resm_vs_base": 0.74,
    "bert_large_vs_base": 0.54,
    "goal_vs_base": 0.85,
}


def make_config(name: str, size: str, overrides: list[str]):
  """The config of one model at ``size`` ('demo', 'smoke' or 'base')."""
  base_size = "demo" if size == "base" else size
  method = {"none": "vanilla", "double": "vanilla"}.get(name, name)
  cfg = harness.load_config(
      f"configs/pkm_wt103.py:{method}_{base_size}", overrides
  )
  m = cfg.model
  if size == "base":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        12, 768, 12, 64, 3072,
    )  # fmt: skip
    m.cutoffs = ()
    cfg.data.seq_len, cfg.data.batch_size = 128, 32
    if name in ("pkm", "resm"):
      m.feed_forward_layers = (4, 8)
      for k, v in zip(
          ("num_keys", "heads", "topk", "k_dim"), (512, 4, 32, 256)
      ):
        m.feed_forward_options[k] = v
  if name == "double":
    m.num_layers *= 2
  m.max_len = max(m.max_len, cfg.data.seq_len)
  cfg.model.dropout = 0.0
  return cfg


class CallBench:
  """Times a jitted function of fixed arguments (``run_rounds`` protocol)."""

  def __init__(self, name: str, fn: Callable[..., Any], *args: Any):
    self.name, self.fn, self.args = name, jax.jit(fn), args
    self.times: list[float] = []
    self.warmup_s = 0.0

  def run(self, steps: int) -> float:
    t0 = time.time()
    out = None
    for _ in range(steps):
      out = self.fn(*self.args)
    jax.block_until_ready(out)
    return (time.time() - t0) / max(steps, 1)

  def warm_up(self, steps: int) -> None:
    self.warmup_s = self.run(steps) * steps

  def result(self, items_per_call: int, unit: str) -> dict[str, Any]:
    out = {"name": self.name, **harness.summarize(self.times, items_per_call)}
    if out.get("seconds_per_step_median"):
      out[f"{unit}_per_s"] = 1.0 / out["seconds_per_step_median"]
    return out


def inference_bench(train: harness.TrainBench) -> CallBench:
  """Batch-1 forward pass of ``train``'s model and parameters."""
  x = jnp.asarray(train.batches[0]["inputs"])[:1]
  model = train.model

  def forward(params, x):
    return model.apply({"params": params}, x, x).target_logprob

  return CallBench(train.name, forward, train.state.params, x)


def layer_benches(cfg: ml_collections.ConfigDict) -> list[CallBench]:
  """The memory layer alone and a dense FFN of equal parameter count."""
  from memjax.models import feed_forward  # pylint: disable=g-import-not-at-top
  from memjax.methods.pkm import layer as pkm  # pylint: disable=g-import-not-at-top

  d = cfg.model.d_model
  o = cfg.model.feed_forward_options
  n = cfg.data.batch_size * cfg.data.seq_len
  x = jax.random.normal(jax.random.PRNGKey(0), (1, n, d))
  memory = pkm.ProductKeyMemory(
      d_model=d, num_keys=o.num_keys, heads=o.heads, topk=o.topk, k_dim=o.k_dim
  )
  mp = jax.jit(lambda: memory.init(jax.random.PRNGKey(0), x[:, :8],
                                   deterministic=True))()  # fmt: skip
  count = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(mp))
  dense = feed_forward.FeedForward(d_model=d, d_ff=max(1, count // (2 * d)))
  dp = dense.init(jax.random.PRNGKey(0), x[:, :8], deterministic=True)

  def fwd_bwd(module):
    def f(params, x):
      loss = lambda p: jnp.sum(module.apply(p, x, deterministic=True))
      return jax.grad(loss)(params)

    return f

  return [
      CallBench(f"dense_ffn_{dense.d_ff}", fwd_bwd(dense), dp, x),
      CallBench("memory_layer", fwd_bwd(memory), mp, x),
  ], count


def optimizer_benches(cfg: ml_collections.ConfigDict) -> list[CallBench]:
  """One values table's update: optax Adam against lazy Adam."""
  from memjax.methods.pkm import lazy_adam as sparse_adam  # pylint: disable=g-import-not-at-top

  o = cfg.model.feed_forward_options
  rows, d = o.num_keys**2, cfg.model.d_model
  reads = cfg.data.batch_size * cfg.data.seq_len * o.heads * o.topk
  idx = jax.random.randint(jax.random.PRNGKey(1), (reads,), 0, rows)
  table = jnp.zeros((rows, d))
  grad = table.at[idx].add(1.0)
  out = []
  for name, tx in (
      ("adam", optax.adam(1e-3)),
      ("lazy_adam", sparse_adam.lazy_adam(1e-3)),
  ):

    def step(grad, state, params, tx=tx):
      updates, state = tx.update(grad, state, params)
      return optax.apply_updates(params, updates), state

    out.append(CallBench(name, step, grad, tx.init(table), table))
  read = float(jnp.mean(jnp.any(grad != 0, axis=1)))
  return out, read


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
      "--size", default="demo", choices=("smoke", "demo", "base")
  )
  harness.add_timing_args(parser, steps=5, warmup=1, rounds=3)
  args = parser.parse_args(argv)
  configs = {n: make_config(n, args.size, args.set) for n in MODELS}
  rng = np.random.default_rng(0)
  train = []
  for name, cfg in configs.items():
    b, l = cfg.data.batch_size, cfg.data.seq_len
    toks = rng.integers(0, VOCAB, (2, b, l + 1)).astype(np.int32)
    batches = [{"inputs": t[:, :-1], "targets": t[:, 1:]} for t in toks]
    harness.log(f"building {name} ({cfg.name}, {cfg.model.num_layers} layers)")
    train.append(harness.TrainBench(name, cfg, VOCAB, batches))
  infer = [inference_bench(t) for t in train]
  layers, layer_params = layer_benches(configs["pkm"])
  optimizers, read_share = optimizer_benches(configs["pkm"])
  timing = dict(rounds=args.rounds, steps=args.steps, warmup=args.warmup)
  harness.log("inference at batch 1")
  harness.run_rounds(infer, **timing)
  harness.log("training steps")
  harness.run_rounds(train, **timing)
  harness.log("memory layer alone, dense FFN of equal parameter count")
  harness.run_rounds(layers, **timing)
  harness.log("values table update")
  harness.run_rounds(optimizers, **timing)
  seq = configs["none"].data.seq_len
  extra = {
      "size": args.size,
      "paper": PAPER,
      "inference_batch_1": [b.result(seq, "batch") for b in infer],
      "memory_layer_params": layer_params,
      "layer_alone": [b.result(1, "call") for b in layers],
      "values_update": [b.result(1, "call") for b in optimizers],
      "values_rows_read_share": read_share,
  }
  for group in ("inference_batch_1", "layer_alone", "values_update"):
    rows = extra[group]
    for r, ratio in zip(
        rows, harness.ratios(rows, ["seconds_per_step_median"])
    ):
      r["time_vs_first"] = ratio["seconds_per_step_median"]
  return harness.finish(
      [t.result() for t in train],
      args,
      ratio_keys=("tokens_per_s", "seconds_per_step_median", "num_params"),
      **extra,
  )


if __name__ == "__main__":
  main()
