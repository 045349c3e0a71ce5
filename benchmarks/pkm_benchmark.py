"""Product-key memory speed: PKM and ResM LMs against the memory-less one.

    python benchmarks/pkm_benchmark.py [--size=demo] [--steps=5] \
        [--warmup=1] [--rounds=3] [--per_round] [--set=KEY=VALUE ...] \
        [--out=FILE]

Builds, at one size of ``configs/pkm_wt103.py``, the memory-less model (the
baseline), the same with two PKM layers (read by ``bag.read``), the same
PKM read by a plain gather (``read='gather'``, the read before the bag),
with two ResM layers, and the memory-less model with twice the layers, and
measures in one run (the models alternate within rounds, the median round
is kept):

* inference at batch 1 (Kim & Jung's Table 1 protocol: one sequence of
  ``data.seq_len`` tokens per call, the jitted forward pass with scores);
* a training step (the training loop's jitted step, state donated; the
  values trained by lazy Adam as the configs train them);
* the memory layer alone (bag and gather reads) against a dense FFN
  (D -> F -> D) with the same parameter count and against the FFN it
  replaces (the model's d_ff), forward and backward over one training
  batch's tokens, with XLA's memory analysis of each (temporaries);
* the optimiser step of one values table: lazy Adam against optax's Adam,
  with the gradient of one training batch's reads.

Batches are random tokens of the demo vocabulary (12,907). ``--size=base``
is BERT-base's shape (12 layers, d 768, 12 heads, FFN 3072, memory layers
{4, 8}, 512^2 slots), for machines that can run it. Prints one JSON object
with ratios against the memory-less model and the machine; the shared
machinery is ``benchmarks/harness.py``. Kim & Jung: BERT-base 79.8 batch/s,
+PKM 61.4 (0.77x), +ResM 59.3 (0.74x), BERT-large 43.1 (0.54x); our goal is
>= 0.85x the memory-less model.

``--per_round`` (the default at ``--size=base``) builds each model's
training state afresh in every round and frees it after, so that one state
is alive at a time (the five base-size states do not fit in 24 GiB
together); a persistent compilation cache makes the rebuilds cheap.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import flax  # pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from benchmarks import harness  # pylint: disable=g-import-not-at-top

VOCAB = 12907
MODELS = ("none", "pkm", "pkm_gather", "resm", "double")
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
  method = {"none": "vanilla", "double": "vanilla", "pkm_gather": "pkm"}.get(
      name, name
  )
  cfg = harness.load_config(
      f"configs/pkm_wt103.py:{method}_{base_size}", overrides
  )
  m = cfg.model
  if size == "base":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        12,
        768,
        12,
        64,
        3072,
    )
    m.cutoffs = ()
    cfg.data.seq_len, cfg.data.batch_size = 128, 32
    if name in ("pkm", "pkm_gather", "resm"):
      m.feed_forward_layers = (4, 8)
      for k, v in zip(
          ("num_keys", "heads", "topk", "k_dim"), (512, 4, 32, 256)
      ):
        m.feed_forward_options[k] = v
  if name == "double":
    m.num_layers *= 2
  if name == "pkm_gather":
    with m.unlocked():
      m.feed_forward_options.read = "gather"
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


def layer_benches(
    cfg: ml_collections.ConfigDict,
) -> tuple[list[CallBench], int, dict[str, int]]:
  """The memory layer alone (both reads), a dense FFN of equal parameter
  count and the FFN the memory replaces; XLA's temporaries of each."""
  from memjax.models import feed_forward  # pylint: disable=g-import-not-at-top
  from memjax.methods.pkm import layer as pkm  # pylint: disable=g-import-not-at-top

  d = cfg.model.d_model
  o = cfg.model.feed_forward_options
  n = cfg.data.batch_size * cfg.data.seq_len
  x = jax.random.normal(jax.random.PRNGKey(0), (1, n, d))
  memories = {
      read: pkm.ProductKeyMemory(
          d_model=d,
          options=pkm.MemoryOptions(
              num_keys=o.num_keys,
              heads=o.heads,
              topk=o.topk,
              k_dim=o.k_dim,
              read=read,
          ),
      )
      for read in ("bag", "gather")
  }
  mp = jax.jit(
      lambda: memories["bag"].init(
          jax.random.PRNGKey(0), x[:, :8], deterministic=True
      )
  )()
  count = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(mp))
  denses = {
      f"dense_ffn_{f}": feed_forward.FeedForward(d_model=d, d_ff=f)
      for f in (max(1, count // (2 * d)), cfg.model.d_ff)
  }

  def fwd_bwd(module):
    def f(params, x):
      loss = lambda p: jnp.sum(module.apply(p, x, deterministic=True))
      return jax.grad(loss)(params)

    return f

  benches = parts_benches(memories["bag"], mp, x)
  for name, dense in denses.items():
    dp = dense.init(jax.random.PRNGKey(0), x[:, :8], deterministic=True)
    benches.append(CallBench(name, fwd_bwd(dense), dp, x))
  for read, memory in memories.items():
    benches.append(CallBench(f"memory_layer_{read}", fwd_bwd(memory), mp, x))
  temps = {
      b.name: int(
          b.fn.lower(*b.args).compile().memory_analysis().temp_size_in_bytes
      )
      for b in benches
  }
  return benches, count, temps


def parts_benches(memory, params, x) -> list[CallBench]:
  """Where a memory layer's time goes: the search (query network, sub-key
  scores, the three top-k, the softmax) and the read (``bag.read``), each
  forward and backward."""
  from memjax.methods.pkm import bag  # pylint: disable=g-import-not-at-top
  from memjax.methods.pkm import layer as pkm  # pylint: disable=g-import-not-at-top

  p = flax.linen.meta.unbox(params["params"])
  xf = x.reshape(-1, x.shape[-1])

  def search(p, xf):
    def loss(p):
      width = memory.options.heads * memory.options.k_dim
      q = flax.linen.Dense(width).apply({"params": p["query"]}, xf)
      q = (
          flax.linen.LayerNorm(epsilon=1e-5)
          .apply({"params": p["query_norm"]}, q)
          .reshape(-1, memory.options.heads, memory.options.k_dim)
      )
      scores, _ = pkm.product_key_topk(q, p["keys"], memory.options.topk)
      return jnp.sum(jax.nn.softmax(scores, -1) * scores)

    return jax.grad(loss)(p)

  # Slots as random as a trained memory's spread of reads (the read's cost
  # does not depend on which rows).
  slots = jax.random.randint(
      jax.random.PRNGKey(3),
      (1, xf.shape[0], memory.options.heads * memory.options.topk),
      0,
      memory.options.num_keys**2,
  )
  weights = jax.random.uniform(jax.random.PRNGKey(4), slots.shape)

  def read(values, weights):
    loss = lambda v, w: jnp.sum(bag.read(v, slots, w))
    return jax.grad(loss, (0, 1))(values, weights)

  return [
      CallBench("memory_search", search, p, xf),
      CallBench("memory_read", read, p["values"], weights),
  ]


class Rebuilt:
  """One model's inference and training benches, built afresh per round.

  ``--per_round``: only this model's state is alive while it runs; the
  compilation cache serves the rebuilds. Exposes ``train`` and ``infer``
  (the last round's benches, their arrays freed) for the report.
  """

  def __init__(self, name, cfg, batches):
    self.name, self.cfg, self.batches = name, cfg, batches
    self.train_times: list[float] = []
    self.infer_times: list[float] = []
    self.train = self.infer = None

  def round(self, steps: int, warmup: int) -> None:
    train = harness.TrainBench(self.name, self.cfg, VOCAB, self.batches)
    infer = inference_bench(train)
    infer.warm_up(warmup)
    self.infer_times.append(infer.run(steps))
    train.warm_up(warmup)
    self.train_times.append(train.run(steps))
    train.times, infer.times = self.train_times, self.infer_times
    train.state = train.batches = infer.args = None  # Free the arrays.
    self.train, self.infer = train, infer


def build_models(configs, args) -> tuple[list[Any], list[CallBench]]:
  """Train and inference benches of every model, timed (run_rounds)."""
  rng = np.random.default_rng(0)
  batches = {}
  for name, cfg in configs.items():
    b, l = cfg.data.batch_size, cfg.data.seq_len
    toks = rng.integers(0, VOCAB, (2, b, l + 1)).astype(np.int32)
    batches[name] = [{"inputs": t[:, :-1], "targets": t[:, 1:]} for t in toks]
  timing = dict(rounds=args.rounds, steps=args.steps, warmup=args.warmup)
  if args.per_round:
    models = [Rebuilt(n, c, batches[n]) for n, c in configs.items()]
    for r in range(args.rounds):
      for m in models:
        harness.log(f"round {r + 1}: building and timing {m.name}")
        m.round(args.steps, args.warmup)
      harness.log(
          f"round {r + 1}/{args.rounds}: "
          + ", ".join(
              f"{m.name} infer {m.infer_times[-1]:.4g} s, train "
              f"{m.train_times[-1]:.4g} s/step"
              for m in models
          )
      )
    return [m.train for m in models], [m.infer for m in models]
  train = []
  for name, cfg in configs.items():
    harness.log(f"building {name} ({cfg.name}, {cfg.model.num_layers} layers)")
    train.append(harness.TrainBench(name, cfg, VOCAB, batches[name]))
  infer = [inference_bench(t) for t in train]
  harness.log("inference at batch 1")
  harness.run_rounds(infer, **timing)
  harness.log("training steps")
  harness.run_rounds(train, **timing)
  return train, infer


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
  parser.add_argument(
      "--per_round",
      action=argparse.BooleanOptionalAction,
      default=None,
      help="build each model's state per round (default: at --size=base)",
  )
  harness.add_timing_args(parser, steps=5, warmup=1, rounds=3)
  args = parser.parse_args(argv)
  if args.per_round is None:
    args.per_round = args.size == "base"
  if args.per_round:
    jax.config.update(
        "jax_compilation_cache_dir",
        os.path.join(os.path.expanduser("~"), ".cache", "memjax_benchmark_jit"),
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  configs = {n: make_config(n, args.size, args.set) for n in MODELS}
  train, infer = build_models(configs, args)
  layers, layer_params, layer_temps = layer_benches(configs["pkm"])
  optimizers, read_share = optimizer_benches(configs["pkm"])
  timing = dict(rounds=args.rounds, steps=args.steps, warmup=args.warmup)
  harness.log("memory layer alone, dense FFNs")
  harness.run_rounds(layers, **timing)
  harness.log("values table update")
  harness.run_rounds(optimizers, **timing)
  seq = configs["none"].data.seq_len
  extra = {
      "size": args.size,
      "per_round": args.per_round,
      "paper": PAPER,
      "inference_batch_1": [b.result(seq, "batch") for b in infer],
      "memory_layer_params": layer_params,
      "layer_alone": [b.result(1, "call") for b in layers],
      "layer_alone_temp_bytes": layer_temps,
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
