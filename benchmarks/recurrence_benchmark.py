"""LaMemo vs Transformer-XL vs Transformer+RPE: step time, memory, FLOPs.

    python benchmarks/recurrence_benchmark.py [--size=demo] [--steps=10]
        [--warmup=2] [--batch=N] [--set=model.dtype=bfloat16 ...] [--out=F]

Builds the three models of ``configs/txl_wt103.py`` / ``configs/lamemo_wt103.py``
at one size (same layers, widths, segment and memory lengths, batch) and, in
one run, measures for each:

* training step time (jitted train step of ``memjax.train``, the state
  donated, the memory carried from step to step; compilation excluded);
* memory: XLA's compiled estimate of one step
  (``sharding.MeshFunction.memory_bytes``: arguments + outputs + temporaries
  - aliased) and the device's peak bytes in use where the runtime reports
  them (GPU, TPU; not CPU);
* FLOPs per token from XLA's cost analysis of the compiled programs: the
  forward pass (the paper's "FLOPs for one step prediction", Table 1), the
  forward pass without the output softmax (the part where the models
  differ), and the whole train step (forward, backward, optimiser).

The adaptive softmax computes every cluster for every position (static
shapes), so its share of the FLOPs grows with the vocabulary and shrinks the
LaMemo / Transformer-XL ratio; at the paper's size (vocabulary 267,735,
full-width clusters) it is the larger part, as in the paper's counts.

Batches are random tokens of the configured vocabulary (``--vocab``, default
267,735: WikiText-103's), so no corpus is read and the paper's sizes run as
they are. Prints one JSON object with ratios against Transformer-XL and the
machine it ran on. The paper counts 191M (LaMemo) against 157M
(Transformer-XL) forward FLOPs per token, 1.22x, and 148M for
Transformer+RPE.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np

from configs import lamemo_wt103  # pylint: disable=g-import-not-at-top
from configs import txl_wt103
from memjax import losses
from memjax import optim
from memjax import sharding as sharding_lib
from memjax import train

WT103_VOCAB = 267735
MODELS = (("lamemo", "lamemo"), ("xl", "txl"), ("rpe", "rpe"))


def machine() -> dict[str, Any]:
  dev = jax.devices()[0]
  return {
      "platform": dev.platform,
      "device_kind": dev.device_kind,
      "device_count": jax.device_count(),
      "cpu": platform.processor() or platform.machine(),
      "cpu_count": os.cpu_count(),
      "jax": jax.__version__,
      "python": platform.python_version(),
  }


def peak_device_bytes() -> int | None:
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"])
  return None


def flops_of(compiled) -> float:
  """XLA's FLOP count of a compiled program (dict or list of dicts)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return float((cost or {}).get("flops", float("nan")))


def make_config(name: str, size: str, overrides: list[str], batch: int):
  if name == "lamemo":
    cfg = lamemo_wt103.get_config(size)
  else:
    cfg = txl_wt103.get_config(f"{'rpe' if name == 'rpe' else 'txl'}_{size}")
  for item in overrides:
    key, _, value = item.partition("=")
    node = cfg
    *parents, leaf = key.split(".")
    for p in parents:
      node = getattr(node, p)
    old = getattr(node, leaf)
    setattr(node, leaf, type(old)(value))
  if batch:
    cfg.data.batch_size = batch
  cfg.data.segments_per_lane = 1
  cfg.loss.name = "lm"
  return cfg


def random_batches(
    cfg, vocab: int, count: int, seed: int = 0
) -> list[dict[str, np.ndarray]]:
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


def measure(cfg, vocab: int, steps: int, warmup: int) -> dict[str, Any]:
  """Step time, memory and FLOPs of one config."""
  mesh = sharding_lib.make_mesh(cfg.mesh.to_dict())
  model = train.build_model(cfg.model, vocab)
  tx, _ = optim.make_optimizer(cfg.optim, cfg.train.num_steps)
  loss_fn = losses.make_loss(cfg.loss, cfg.train.num_steps)
  host = random_batches(cfg, vocab, warmup + steps)
  state, shardings = train.create_state(
      model, tx, mesh, host[0], jax.random.PRNGKey(0)
  )
  step = train.make_train_step(
      model,
      tx,
      loss_fn,
      grad_accum=cfg.train.grad_accum,
      state_shardings=shardings,
      mesh=mesh,
  )
  batches = [sharding_lib.put_global_batch(b, mesh) for b in host]
  rng = jax.random.PRNGKey(1)
  tokens_per_step = cfg.data.batch_size * cfg.data.seq_len

  # Cost analysis and memory estimate of the train step and the forward pass.
  with sharding_lib.mesh_rules(mesh):
    step_compiled = step.jitted.lower(state, batches[0], rng).compile()

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

    fwd_compiled = (
        jax.jit(forward).lower(state.params, batches[0], state.memory).compile()
    )
    body_compiled = (
        jax.jit(body).lower(state.params, batches[0], state.memory).compile()
    )
  result = {
      "config": cfg.name,
      "attention": cfg.model.attention,
      "mem_len": cfg.model.mem_len,
      "seq_len": cfg.data.seq_len,
      "batch_size": cfg.data.batch_size,
      "num_params": int(
          sum(np.prod(x.shape) for x in jax.tree.leaves(state.params))
      ),
      "forward_flops_per_token": flops_of(fwd_compiled) / tokens_per_step,
      "body_flops_per_token": flops_of(body_compiled) / tokens_per_step,
      "train_step_flops_per_token": flops_of(step_compiled) / tokens_per_step,
      "step_memory_bytes": step.memory_bytes(state, batches[0], rng),
  }
  del step_compiled, fwd_compiled, body_compiled
  if steps <= 0:
    result["device_peak_bytes"] = peak_device_bytes()
    return result

  t0 = time.time()
  for i in range(warmup):
    state, m = step(state, batches[i], rng)
  jax.block_until_ready(m)
  result["warmup_s"] = time.time() - t0
  t0 = time.time()
  for i in range(warmup, warmup + steps):
    state, m = step(state, batches[i], rng)
  jax.block_until_ready((state, m))
  dt = time.time() - t0
  result.update(
      steps=steps,
      seconds_per_step=dt / steps,
      tokens_per_s=steps * tokens_per_step / dt,
      final_loss=float(m["loss"]),
      device_peak_bytes=peak_device_bytes(),
  )
  return result


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", default="demo", choices=txl_wt103.SIZES)
  p.add_argument(
      "--steps",
      type=int,
      default=10,
      help="timed steps; 0 = FLOPs and memory estimates only (no "
      "step is run: for sizes too large for the machine)",
  )
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--batch", type=int, default=0, help="override batch size")
  p.add_argument(
      "--vocab",
      type=int,
      default=0,
      help="vocabulary size (default: WikiText-103's; 259 bytes "
      "for enwik8 and text8)",
  )
  p.add_argument(
      "--set",
      action="append",
      default=[],
      help="key=value config override applied to every model",
  )
  p.add_argument("--models", default="lamemo,xl,rpe")
  p.add_argument("--out", default="", help="also write the JSON here")
  args = p.parse_args(argv)
  vocab = args.vocab or (
      259 if args.size in ("enwik8", "text8") else WT103_VOCAB
  )
  if args.size in ("smoke", "demo") and not args.vocab:
    vocab = 12907  # The demo corpus's vocabulary (cut-offs 2000, 6000).
  wanted = args.models.split(",")
  results = {}
  for name, _ in MODELS:
    if name not in wanted:
      continue
    cfg = make_config(name, args.size, args.set, args.batch)
    r = measure(cfg, vocab, args.steps, args.warmup)
    results[name] = r
    print(
        f"{name}: {r.get('seconds_per_step', float('nan')) * 1e3:.1f} "
        f"ms/step, {r['forward_flops_per_token'] / 1e6:.1f} MFLOPs/token "
        f"forward, {r['body_flops_per_token'] / 1e6:.1f} without the softmax, "
        f"{r['step_memory_bytes'] / 2**20:.1f} MiB step memory",
        file=sys.stderr,
        flush=True,
    )
  ratios = {}
  if "xl" in results:
    base = results["xl"]
    for name, r in results.items():
      ratio = {}
      if "seconds_per_step" in r and "seconds_per_step" in base:
        ratio["step_time"] = r["seconds_per_step"] / base["seconds_per_step"]
      ratio.update(
          {
              "forward_flops_per_token": (
                  r["forward_flops_per_token"] / base["forward_flops_per_token"]
              ),
              "body_flops_per_token": (
                  r["body_flops_per_token"] / base["body_flops_per_token"]
              ),
              "train_step_flops_per_token": (
                  r["train_step_flops_per_token"]
                  / base["train_step_flops_per_token"]
              ),
              "step_memory": r["step_memory_bytes"] / base["step_memory_bytes"],
          }
      )
      if r["device_peak_bytes"] and base["device_peak_bytes"]:
        ratio["device_peak"] = (
            r["device_peak_bytes"] / base["device_peak_bytes"]
        )
      ratios[name] = ratio
  report = {
      "machine": machine(),
      "size": args.size,
      "vocab": vocab,
      "results": results,
      "ratios_vs_xl": ratios,
      "paper": {
          "forward_flops_per_token": {
              "lamemo": 191e6,
              "xl": 157e6,
              "rpe": 148e6,
          },
          "target_step_time_ratio_lamemo_vs_xl": 1.25,
      },
  }
  text = json.dumps(report, indent=2)
  print(text)
  for name, r in ratios.items():
    print(
        f"{name} / xl: step time {r.get('step_time', float('nan')):.3f}x, "
        f"forward FLOPs/token {r['forward_flops_per_token']:.3f}x (without "
        f"the softmax {r['body_flops_per_token']:.3f}x), train-step FLOPs/token "
        f"{r['train_step_flops_per_token']:.3f}x, step memory "
        f"{r['step_memory']:.3f}x",
        file=sys.stderr,
    )
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
