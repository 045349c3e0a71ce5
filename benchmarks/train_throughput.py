"""Training throughput and peak memory of one or more configs, in one run.

    python benchmarks/train_throughput.py \
        --config=configs/trime_wt103.py:demo [--config=OTHER ...] \
        [--steps=20] [--warmup=3] [--set=model.dtype=bfloat16 ...]

The first config is the baseline: every other one is reported with its
tokens/s and peak-memory ratios against it. Prints one JSON object with the
machine it ran on. Peak memory is the device's peak bytes in use where the
runtime reports it (GPU, TPU); on CPU it is XLA's compiled memory analysis of
the train step (arguments + outputs + temporaries - aliased), plus the
process's peak resident set for context.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from memjax import losses  # pylint: disable=g-import-not-at-top
from memjax import optim
from memjax import sharding as sharding_lib
from memjax import train


def load_config(spec: str, overrides: list[str]):
  """Loads 'path.py[:arg]' and applies 'key=value' overrides."""
  path, _, arg = spec.partition(":")
  mod_spec = importlib.util.spec_from_file_location("bench_config", path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  cfg = mod.get_config(arg) if arg else mod.get_config()
  for item in overrides:
    key, _, value = item.partition("=")
    node = cfg
    *parents, leaf = key.split(".")
    for p in parents:
      node = getattr(node, p)
    old = getattr(node, leaf)
    setattr(node, leaf, type(old)(value) if not isinstance(old, (tuple, list)) else eval(value))  # pylint: disable=eval-used
  return cfg


def machine() -> dict:
  dev = jax.devices()[0]
  return {"platform": dev.platform, "device_kind": dev.device_kind,
          "device_count": jax.device_count(), "cpu": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "jax": jax.__version__,
          "python": platform.python_version()}


def peak_device_bytes() -> int | None:
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"])
  return None


def measure(cfg, steps: int, warmup: int, workdir: str) -> dict:
  """Times ``steps`` updates after ``warmup`` (compilation included there)."""
  mesh = sharding_lib.make_mesh(cfg.mesh.to_dict())
  data = train.load_data(cfg, workdir)
  model = train.build_model(cfg.model, data.vocab_size)
  tx, _ = optim.make_optimizer(cfg.optim, cfg.train.num_steps)
  loss_fn = losses.make_loss(cfg.loss, cfg.train.num_steps)
  sample = train.host_batch(data.batcher, 0)
  state, shardings = train.create_state(model, tx, mesh, sample, jax.random.PRNGKey(0))
  step = train.make_train_step(model, tx, loss_fn, grad_accum=cfg.train.grad_accum,
                               state_shardings=shardings, mesh=mesh)
  batches = [sharding_lib.put_global_batch(train.host_batch(data.batcher, i), mesh)
             for i in range(warmup + steps)]
  rng = jax.random.PRNGKey(1)
  t0 = time.time()
  for i in range(warmup):
    state, m = step(state, batches[i], rng)
  jax.block_until_ready(m)
  compile_s = time.time() - t0
  t0 = time.time()
  for i in range(warmup, warmup + steps):
    state, m = step(state, batches[i], rng)
  jax.block_until_ready(m)
  dt = time.time() - t0
  tokens = steps * cfg.data.batch_size * cfg.data.seq_len
  out = {"config": cfg.name, "tokens_per_step": cfg.data.batch_size * cfg.data.seq_len,
         "steps": steps, "seconds_per_step": dt / steps, "tokens_per_s": tokens / dt,
         "warmup_s": compile_s, "final_loss": float(m["loss"]),
         "num_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(state.params)))}
  out["step_memory_bytes"] = step.memory_bytes(state, batches[0], rng)
  out["device_peak_bytes"] = peak_device_bytes()
  out["process_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", action="append", required=True)
  p.add_argument("--set", action="append", default=[],
                 help="key=value override applied to every config")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--out", default="", help="also write the JSON here")
  args = p.parse_args(argv)
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for spec in args.config:
      cfg = load_config(spec, args.set)
      r = measure(cfg, args.steps, args.warmup, tmp)
      r["spec"] = spec
      results.append(r)
      print(f"{spec}: {r['tokens_per_s']:.0f} tokens/s, "
            f"{r['step_memory_bytes'] / 2**20:.1f} MiB step memory", file=sys.stderr)
  base = results[0]
  for r in results[1:]:
    r["speed_ratio_vs_baseline"] = r["tokens_per_s"] / base["tokens_per_s"]
    r["memory_ratio_vs_baseline"] = r["step_memory_bytes"] / base["step_memory_bytes"]
    if r["device_peak_bytes"] and base["device_peak_bytes"]:
      r["device_peak_ratio_vs_baseline"] = r["device_peak_bytes"] / base["device_peak_bytes"]
  report = {"machine": machine(), "baseline": base["spec"], "results": results}
  text = json.dumps(report, indent=2)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
