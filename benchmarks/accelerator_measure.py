"""The accelerator check's measurements: one item per process.

    python benchmarks/accelerator_measure.py --spec=SPEC.json --result=OUT.json

Started by ``benchmarks/accelerator_check.py``, once per item, so that each
item's peak device memory is its own, an item that runs past the budget
can be stopped, and an out-of-memory failure leaves the next item a fresh
device. The spec's ``kind``:

* ``machine``: ``harness.machine`` (platform, device kind and count) and
  the versions of jax, jaxlib, flax, optax, orbax-checkpoint,
  ml_collections and scann.
* ``train``: one config's train step on the first device (mesh
  ``{'data': 1}``), built by ``harness.TrainBench`` as the training loop
  builds it, on random batches of the declared shapes
  (``Run.batch_shapes``; token ids below the vocabulary size). Records
  XLA's compile time (``jax.monitoring``'s backend compile events), the
  median round's step time and tokens/s (``harness.run_rounds``), the
  device's peak bytes in use, XLA's FLOPs per step (the lowered program's
  HLO with every loop times its trip count, ``memjax.modes.hlo_flops``, as
  ``--mode=plan`` counts; and XLA's cost analysis, which counts each loop
  body once) and the model FLOPs per token of ``--mode=plan``'s formula.
  Out of memory, the batch is halved (at most ``max_halvings`` times) and
  the overrides it ran with are returned.
* ``knn``: exact top-k over random keys on the device
  (``memjax.memory.search.exact_topk``) against ScaNN on the host
  (``search.build_shard_index``) where ``scann`` imports: queries/s and
  ScaNN's recall@k against the exact neighbours.

Writes ``{"status": "ok" | "error: <one line>", "measured": {...}}``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from benchmarks import harness  # pylint: disable=g-import-not-at-top

ONE_DEVICE = {"data": 1}
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
VERSIONS = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "ml_collections",
    "scann",
)
# The share of MLM positions scored (BERT's 15%).
MASKED_SHARE = 0.15

_COMPILES: list[float] = []


def _record_compile(event: str, duration: float, **_: Any) -> None:
  if event == COMPILE_EVENT:
    _COMPILES.append(float(duration))


def one_line(e: BaseException) -> str:
  """An exception as one short line: its type and first line."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  text = f"{type(e).__name__}: {lines[0] if lines else ''}".strip(": ")
  return text[:300]


def machine() -> dict[str, Any]:
  """``harness.machine`` with the packages' versions (None: missing)."""
  out = harness.machine()
  for name in VERSIONS:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  stats = jax.devices()[0].memory_stats() or {}
  out["device_memory_bytes"] = stats.get("bytes_limit")
  return out


# Train steps.


def synthetic_batches(
    shapes: dict[str, Any], vocab: int, segments_per_lane: int, count: int = 2
) -> list[dict[str, np.ndarray]]:
  """``count`` random global batches of the declared ``shapes``.

  Token ids (any int array) are uniform below ``vocab``; 'lane_id' numbers
  the lanes of ``segments_per_lane`` rows; 'reset' (bool) is True in the
  first batch only; 'weights' (MLM) marks ``MASKED_SHARE`` of the
  positions, other float arrays are ones.
  """
  rng = np.random.default_rng(0)
  out = []
  for i in range(count):
    batch = {}
    for key, (shape, dtype) in shapes.items():
      dtype = np.dtype(dtype)
      if key == "lane_id":
        lanes = shape[0] // segments_per_lane
        batch[key] = np.repeat(np.arange(lanes), segments_per_lane)
      elif dtype == np.bool_:
        batch[key] = np.full(shape, i == 0)
      elif key == "weights":
        batch[key] = rng.random(shape) < MASKED_SHARE
      elif np.issubdtype(dtype, np.floating):
        batch[key] = np.ones(shape)
      else:
        batch[key] = rng.integers(0, vocab, shape)
      batch[key] = batch[key].astype(dtype)
    out.append(batch)
  return out


def out_of_memory(e: BaseException) -> bool:
  text = str(e)
  return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text


def set_override(overrides: list[str], key: str, value: Any) -> list[str]:
  """``overrides`` with ``key`` set to ``value`` (earlier settings of it
  dropped)."""
  return [o for o in overrides if o.split("=")[0] != key] + [f"{key}={value}"]


def halved(cfg: Any, overrides: list[str]) -> list[str] | None:
  """The overrides at half the batch (one micro-batch when the half does
  not split into the config's), or None below one lane."""
  d = cfg.data
  rows, lane = int(d.batch_size) // 2, int(d.segments_per_lane)
  accum = int(cfg.train.grad_accum)
  if rows < lane or rows % lane:
    return None
  if rows % (accum * lane):
    accum = 1
  out = set_override(overrides, "data.batch_size", rows)
  return set_override(out, "train.grad_accum", accum)


def step_flops(bench: harness.TrainBench) -> dict[str, float | None]:
  """XLA's FLOPs per step: with trip counts (``--mode=plan``'s count of the
  lowered program) and XLA's cost analysis of the compiled program (each
  loop body once)."""
  from memjax.modes import plan_compile  # pylint: disable=g-import-not-at-top

  lowered = bench.step.lower(bench.state, bench.batches[0], bench.rng)
  out: dict[str, float | None] = {
      "xla_flops_per_step": plan_compile.program_flops(lowered).total()
  }
  analysis = lowered.compile().cost_analysis()  # the step's, cached
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  flops = (analysis or {}).get("flops")
  out["cost_analysis_flops_per_step"] = None if flops is None else float(flops)
  return out


def model_flops_per_token(cfg: Any) -> float:
  """``--mode=plan``'s formula FLOPs per token ('model': those of MFU)."""
  # pylint: disable=g-import-not-at-top
  from memjax.modes import plan
  from memjax.modes import plan_compile

  run = harness._build(cfg, mesh=ONE_DEVICE)  # pylint: disable=protected-access
  return plan.step_formula(plan_compile.build_step(run, jax.devices()[:1]))[
      "model"
  ]


def train_once(spec: dict[str, Any], cfg: Any) -> dict[str, Any]:
  """One config's measurements at its batch (see the module doc)."""
  run = harness._build(cfg, mesh=ONE_DEVICE)  # pylint: disable=protected-access
  shapes = run.batch_shapes(1)
  del run
  vocab = int(spec["vocab_size"])
  batches = synthetic_batches(shapes, vocab, int(cfg.data.segments_per_lane))
  _COMPILES.clear()
  start = time.perf_counter()
  bench = harness.TrainBench(spec["name"], cfg, vocab, batches, ONE_DEVICE)
  harness.log(f"{spec['name']}: built in {time.perf_counter() - start:.1f} s")
  harness.run_rounds(
      [bench],
      rounds=int(spec["rounds"]),
      steps=int(spec["steps"]),
      warmup=int(spec["warmup"]),
  )
  r = bench.result()
  peak = harness.device_peak_bytes()
  out = {
      "batch_size": int(cfg.data.batch_size),
      "seq_len": int(cfg.data.seq_len),
      "grad_accum": int(cfg.train.grad_accum),
      "tokens_per_step": bench.tokens_per_step,
      "dtype": str(cfg.model.dtype),
      "vocab_size": vocab,
      "num_params": r["num_params"],
      "compile_s": max(_COMPILES) if _COMPILES else "n/a: no compilation seen",
      "setup_s": r["setup_s"],
      "step_s": r["seconds_per_step_median"],
      "step_s_all_rounds": r["seconds_per_step_all_rounds"],
      "tokens_per_s": r["tokens_per_s"],
      "peak_bytes": "n/a" if peak is None else peak,
      "step_memory_bytes": r["step_memory_bytes"],
      "loss": r.get("loss"),
      "timing_changes": r["timing_changes"],
  }
  try:
    out.update(step_flops(bench))
  except Exception as e:  # pylint: disable=broad-except
    out["xla_flops_per_step"] = f"n/a: {one_line(e)}"
  del bench, batches
  try:
    out["model_flops_per_token"] = model_flops_per_token(cfg)
  except Exception as e:  # pylint: disable=broad-except
    out["model_flops_per_token"] = f"n/a: {one_line(e)}"
  return out


def measure_train(spec: dict[str, Any]) -> dict[str, Any]:
  """``train_once``, halving the batch when it does not fit."""
  overrides = list(spec["overrides"])
  halvings = 0
  while True:
    cfg = harness.load_config(spec["config"], overrides)
    try:
      out = train_once(spec, cfg)
      break
    except Exception as e:  # pylint: disable=broad-except
      smaller = halved(cfg, overrides) if out_of_memory(e) else None
      if smaller is None or halvings == int(spec["max_halvings"]):
        raise
    halvings += 1
    harness.log(f"{spec['name']}: out of memory, halving the batch")
    overrides = smaller
    gc.collect()  # The failed attempt's arrays (its traceback is gone).
  out["halvings"] = halvings
  return {"measured": out, "overrides": overrides}


# kNN search.


def measure_knn(spec: dict[str, Any]) -> dict[str, Any]:
  """Exact top-k on the device against ScaNN on the host (dot product)."""
  from memjax.memory import search  # pylint: disable=g-import-not-at-top

  n, d, k, q = (int(spec[x]) for x in ("keys", "dim", "k", "queries"))
  rng = np.random.default_rng(0)
  keys = rng.standard_normal((n, d), dtype=np.float32)
  queries = rng.standard_normal((q, d), dtype=np.float32)
  device_keys = jax.block_until_ready(jax.device_put(keys))
  metric = "dot_product"
  out: dict[str, Any] = {"keys": n, "dim": d, "k": k, "queries": q}
  out["metric"] = metric
  out["exact"] = "memjax.memory.search.exact_topk (blockwise jax.lax.top_k)"
  _, seconds = search.timed(
      search.exact_topk, queries[:256], device_keys, k, metric
  )
  out["exact_first_call_s"] = seconds  # compiles the one program
  (_, exact), seconds = search.timed(
      search.exact_topk, queries, device_keys, k, metric
  )
  out["exact_queries_per_s"] = q / seconds
  harness.log(f"knn: exact {out['exact_queries_per_s']:.4g} queries/s")
  if importlib.util.find_spec("scann") is None:
    out["scann"] = "n/a: scann not installed"
    return {"measured": out}
  try:
    start = time.perf_counter()
    index = search.build_shard_index(keys, metric, k)
    out["scann_build_s"] = time.perf_counter() - start
    reorder = max(2 * k, 256)

    def scann(x):
      return index.search_batched_parallel(
          x, final_num_neighbors=k, pre_reorder_num_neighbors=reorder
      )

    scann(queries[:8])
    (found, _), seconds = search.timed(scann, queries)
    out["scann_queries_per_s"] = q / seconds
    out["recall_at_k"] = search.recall_at_k(np.asarray(found), exact)
    out["scann"] = "ok"
  except Exception as e:  # pylint: disable=broad-except
    out["scann"] = f"error: {one_line(e)}"
  return {"measured": out}


KINDS = {
    "machine": lambda spec: {"machine": machine()},
    "train": measure_train,
    "knn": measure_knn,
}


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--spec", required=True, help="the item's JSON spec")
  p.add_argument("--result", required=True, help="where its JSON goes")
  args = p.parse_args(argv)
  with open(args.spec) as f:
    spec = json.load(f)
  jax.monitoring.register_event_duration_secs_listener(_record_compile)
  try:
    result = {"status": "ok", **KINDS[spec["kind"]](spec)}
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    result = {"status": f"error: {one_line(e)}"}
  with open(args.result, "w") as f:
    json.dump(result, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
