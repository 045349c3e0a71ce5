"""Training throughput and peak memory of one or more configs, in one run.

    python benchmarks/train_throughput.py \
        --config=configs/trime_wt103.py:demo [--config=OTHER ...] \
        [--steps=20] [--warmup=3] [--set=model.dtype=bfloat16 ...]

The first config is the baseline: every other one is reported with its
tokens/s and peak-memory ratios against it. Prints one JSON object with the
machine it ran on. Peak memory is the device's peak bytes in use where the
runtime reports it (GPU, TPU); on CPU it is XLA's compiled memory analysis of
the train step (arguments + outputs + temporaries - aliased), plus the
process's peak resident set for context. Configs alternate within each round
and the median round is reported, so changes in machine load during the run
affect every config alike.
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


class Runner:
  """One config's model, state, compiled step and batches."""

  def __init__(self, spec: str, cfg, steps: int, workdir: str):
    self.spec, self.cfg = spec, cfg
    mesh = sharding_lib.make_mesh(cfg.mesh.to_dict())
    data = train.load_data(cfg, workdir)
    model = train.build_model(cfg.model, data.vocab_size)
    tx, _ = optim.make_optimizer(cfg.optim, cfg.train.num_steps)
    loss_fn = losses.make_loss(cfg.loss, cfg.train.num_steps)
    sample = train.host_batch(data.batcher, 0)
    self.state, shardings = train.create_state(
        model, tx, mesh, sample, jax.random.PRNGKey(0)
    )
    self.step = train.make_train_step(
        model,
        tx,
        loss_fn,
        grad_accum=cfg.train.grad_accum,
        state_shardings=shardings,
        mesh=mesh,
    )
    self.batches = [
        sharding_lib.put_global_batch(train.host_batch(data.batcher, i), mesh)
        for i in range(steps)
    ]
    self.rng = jax.random.PRNGKey(1)
    self.num_params = int(
        sum(np.prod(x.shape) for x in jax.tree.leaves(self.state.params))
    )
    self.memory_bytes = self.step.memory_bytes(
        self.state, self.batches[0], self.rng
    )
    t0 = time.time()
    self.run(1)
    self.warmup_s = time.time() - t0
    self.times: list[float] = []

  def run(self, steps: int) -> float:
    """Runs ``steps`` updates; returns seconds per step."""
    t0 = time.time()
    for i in range(steps):
      self.state, m = self.step(
          self.state, self.batches[i % len(self.batches)], self.rng
      )
    jax.block_until_ready(m)
    self.last_loss = float(m["loss"])
    return (time.time() - t0) / steps

  def report(self) -> dict:
    sps = float(np.median(self.times))
    tokens = self.cfg.data.batch_size * self.cfg.data.seq_len
    return {
        "spec": self.spec,
        "config": self.cfg.name,
        "tokens_per_step": tokens,
        "seconds_per_step_median": sps,
        "seconds_per_step_all_rounds": self.times,
        "tokens_per_s": tokens / sps,
        "warmup_s": self.warmup_s,
        "num_params": self.num_params,
        "step_memory_bytes": self.memory_bytes,
        "device_peak_bytes": peak_device_bytes(),
    }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", action="append", required=True)
  p.add_argument(
      "--set",
      action="append",
      default=[],
      help="key=value override applied to every config",
  )
  p.add_argument("--steps", type=int, default=10, help="steps per round")
  p.add_argument(
      "--rounds",
      type=int,
      default=3,
      help="rounds; configs alternate within each round so that "
      "drifts in machine load hit all of them alike",
  )
  p.add_argument("--out", default="", help="also write the JSON here")
  args = p.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    runners = [
        Runner(spec, load_config(spec, args.set), args.steps, tmp)
        for spec in args.config
    ]
  for r in range(args.rounds):
    for runner in runners:
      runner.times.append(runner.run(args.steps))
    print(
        f"round {r + 1}/{args.rounds}: "
        + ", ".join(f"{x.spec} {x.times[-1]:.3f}s/step" for x in runners),
        file=sys.stderr,
    )
  results = [x.report() for x in runners]
  results[0]["process_peak_rss_bytes"] = (
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  )
  base = results[0]
  for r in results[1:]:
    r["speed_ratio_vs_baseline"] = r["tokens_per_s"] / base["tokens_per_s"]
    r["memory_ratio_vs_baseline"] = (
        r["step_memory_bytes"] / base["step_memory_bytes"]
    )
    if r["device_peak_bytes"] and base["device_peak_bytes"]:
      r["device_peak_ratio_vs_baseline"] = (
          r["device_peak_bytes"] / base["device_peak_bytes"]
      )
  report = {"machine": machine(), "baseline": base["spec"], "results": results}
  text = json.dumps(report, indent=2)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
