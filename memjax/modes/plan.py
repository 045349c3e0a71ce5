"""``--mode=plan``: compile a config's train step for a target, don't run it.

    python -m memjax.main --mode=plan --workdir=plans/247m \\
        --config=configs/trime_wt103.py:trime_247m --config.plan.platform=v4-8

The step is lowered and compiled ahead of time with ``plan.devices``
devices and the config's mesh (``memjax.modes.plan_compile``): fake CPU
devices (``--xla_force_host_platform_device_count``, set by
``memjax.main`` before JAX starts), or a libtpu topology for a TPU platform
when libtpu is installed. No corpus is read (the vocabulary size comes from
the config, ``plan.vocab_size`` or the corpus's published size), nothing is
trained and no checkpoint is written: only ``plan.json`` and ``plan.md`` in
the workdir (a re-run replaces them).

What it reports, per dtype (``plan.dtypes``: model.dtype float32 and
bfloat16):

* parameters, and FLOPs per token: XLA's rules applied to the step's HLO,
  each loop body times its trip count (``memjax.modes.hlo_flops``), next
  to the formula
  ``6 N + 12 n_layer T d_attn`` (PaLM, Chowdhery et al. 2022, App. B: N
  parameters, T the attended positions, d_attn = heads x head_dim; the 12
  counts QK^T and AV, forward and backward, without exploiting the causal
  mask, as the step computes them), plus what the model computes that this
  does not count: the adaptive input's projections (``6 N_proj``: used at
  the input as well as the output) and the terms the methods declare
  (``extend.Method.flops``: relative positions and memory rows of
  Transformer-XL and LaMemo, MARGE's sources and cross-attention,
  product-key values read instead of whole tables, the encoder-decoder's
  cross-attention). "With recomputation" adds what the step computes on
  top: the adaptive softmax's chunks, balanced (at most one padded position
  per chunk) and rematerialised (``6 N_softmax (P - 1) + 2 N_softmax P``, P
  the padded positions over T), and with ``model.remat`` ``2 (N_layers - N_last) +
  4 n_layer T d_attn`` and a third of the methods' terms (N_last: each
  block's feed-forward output projection, whose output remat keeps as the
  next block's input, so it is not recomputed). Elementwise work (softmax,
  norms) is left out; XLA counts it;
* per-device memory (XLA's memory analysis of the compiled step):
  parameters, optimiser state, temporaries, total, and the largest
  micro-batch that fits ``plan.memory_fraction`` of the platform's memory
  (temporaries grow linearly with the micro-batch: a second compile at
  twice the batch gives the slope);
* where a dtype does not fit, the overrides with which it does
  (``memjax.modes.plan_fit``: more micro-batches, then rematerialisation),
  each checked by compiling the step with them;
* the step time and tokens/s at ``plan.utilization`` of the platform's peak
  for the per-device FLOPs of the compiled, partitioned step (work repeated
  on every device included; "repeated" in the table is the per-device FLOPs
  times the devices over the program's, 1 when no work is repeated).
* with ``plan.eval_step``, the same for the evaluation step, the forward
  the scorers run (``memjax.modes.plan_eval``), next to a third of the
  formula at its batch, in a second table.

A pretrained model is planned from its ``config.json`` alone
(``config.pretrained.path``; ``memjax.pretrained.sizes.apply_folder``).

Figures compiled on CPU for a GPU or TPU are estimates (``estimate: true``):
XLA's CPU backend fuses and lays out differently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from memjax import extend
from memjax import settings as settings_lib
from memjax.io import console
from memjax.io import paths
from memjax.models import adaptive
from memjax.modes import plan_buffers
from memjax.modes import plan_compile
from memjax.modes import plan_eval
from memjax.modes import plan_fit
from memjax.modes import platforms
from memjax.run import spec


def softmax_positions(
    s: settings_lib.Settings, shape: extend.FlopsShape
) -> tuple[int, bool]:
  """(positions per row the adaptive softmax scores, whether in chunks).

  ``models.adaptive.AdaptiveEmbed.score``: at most ``model.softmax_chunk``
  tokens at a time over the rows, the positions spread evenly over the
  chunks (``adaptive.chunk_layout``: at most one padded position per
  chunk), each chunk rematerialised in the backward pass.
  """
  n = shape.seq_len
  if not s.model.cutoffs:
    return n, False
  chunk, chunks = adaptive.chunk_layout(
      shape.rows, n, int(s.model.softmax_chunk)
  )
  return chunk * chunks, chunks > 1


# The engine's feed-forward kinds (a block's last product is their output
# projection, d_ff x D).
PLAIN_FEED_FORWARD = ("ffn", "glu")


def _plain_ffn_layers(s: settings_lib.Settings) -> int:
  """Layers whose feed-forward is one of ``PLAIN_FEED_FORWARD``."""
  m = s.model
  layers = int(m.num_layers) + int(m.family_options.get("encoder_layers", 0))
  if m.feed_forward in PLAIN_FEED_FORWARD:
    return layers
  # The layers outside model.feed_forward_layers (none when it is empty)
  # take the plain feed-forward.
  chosen = len(tuple(m.feed_forward_layers))
  return layers - chosen if chosen else 0


def formula_flops(
    s: settings_lib.Settings,
    shape: extend.FlopsShape,
    terms_of: Sequence[Callable[..., Mapping[str, float]]] = (),
) -> dict[str, Any]:
  """FLOPs per token by formula (see the module doc).

  Args:
    s: the planned run's settings.
    shape: the batch's and the parameters' sizes.
    terms_of: the methods' terms (``extend.Parts.flops``), each called
      with ``s`` and ``shape``.

  Returns:
    'model': 6 N + 12 n_layer T d_attn, the adaptive input's projections
    (6 N_proj: the formula counts them once, at the output) and the
    methods' terms; 'with_recompute': plus the padding of the adaptive
    softmax's chunks and the rematerialised forward passes; 'terms': the
    methods' terms (``extend.Method.flops``) by name; 'before': 6 N + 12
    n_layer T d_attn with the recomputation (2 N_softmax when chunked,
    2 N_layers + 4 n_layer T d_attn with ``model.remat``), as counted
    before the terms.
  """
  m = s.model
  n_all, n_soft = shape.num_params, shape.softmax_params
  layers = int(m.num_layers) + int(m.family_options.get("encoder_layers", 0))
  span = shape.seq_len + int(m.mem_len)
  attn = 12.0 * layers * span * int(m.num_heads) * int(m.head_dim)
  terms: dict[str, float] = {}
  for flops in terms_of:
    for name, value in flops(s, shape).items():
      terms[name] = terms.get(name, 0.0) + float(value)
  added = sum(terms.values())
  model = 6.0 * n_all + attn + 6.0 * shape.projection_params + added
  scored, chunked = softmax_positions(s, shape)
  pad = scored / shape.seq_len
  recompute = 6.0 * n_soft * (pad - 1.0) + (
      2.0 * n_soft * pad if chunked else 0
  )
  before = 6.0 * n_all + attn + (2.0 * n_soft if chunked else 0.0)
  if m.remat:
    before += 2.0 * (n_all - n_soft) + attn / 3.0
    # A rematerialised block's last product, the feed-forward's output
    # projection (d_ff x D in the engine's kinds), is not recomputed: its
    # output is only the next block's input, which remat keeps.
    last = _plain_ffn_layers(s) * int(m.d_ff) * int(m.d_model)
    recompute += 2.0 * (n_all - n_soft - last) + attn / 3.0 + added / 3.0
  return {
      "model": model,
      "with_recompute": model + recompute,
      "terms": terms,
      "before": before,
  }


def _flops_shape(step: plan_compile.Step) -> extend.FlopsShape:
  """The batch's and the parameters' sizes of a train step built by
  ``plan_compile.build_step``."""
  inputs = step.args[1]["inputs"].shape
  accum = int(step.run.settings.train.grad_accum)
  embedder = step.args[0].params.get("embedder", {})
  projections = sum(
      int(np.prod(x.shape))
      for k, v in embedder.items()
      if k.startswith("proj_")
      for x in jax.tree.leaves(v)
  )
  return extend.FlopsShape(
      seq_len=int(inputs[1]),
      rows=int(inputs[0]) // accum,
      num_params=step.num_params,
      softmax_params=plan_compile.module_params(step, "embedder"),
      projection_params=projections,
      vocab_size=plan_compile.vocab_size(step.run.settings),
  )


def step_formula(step: plan_compile.Step) -> dict[str, Any]:
  """``formula_flops`` of a step built by ``plan_compile.build_step``."""
  return formula_flops(
      step.run.settings, _flops_shape(step), step.run.parts.flops
  )


def eval_formula(step: plan_compile.Step, rows: int, length: int) -> float:
  """Forward FLOPs per position of the evaluation step by formula: a third
  of ``formula_flops``'s 'model' (forward, backward: 1 + 2) at the
  evaluation batch's ``rows`` x ``length`` (``2 N + 4 n_layer T d_attn``
  and the forward of the methods' terms)."""
  shape = dataclasses.replace(_flops_shape(step), seq_len=length, rows=rows)
  s = step.run.settings
  return formula_flops(s, shape, step.run.parts.flops)["model"] / 3.0


def _fit(run: spec.Run, devices, step, memory, usable: float) -> dict[str, Any]:
  """The largest micro-batch (global rows) that fits ``usable`` bytes per
  device: a second compile at twice ``data.batch_size`` gives the slope of
  the per-device total in micro-batch rows. None when the batch does not
  grow with ``data.batch_size`` (batches by token count)."""
  s = run.settings
  d, accum = s.data, int(s.train.grad_accum)
  big = run.replace(dataclasses.replace(d, batch_size=2 * int(d.batch_size)))
  big_step = plan_compile.build_step(big, devices)
  micro = step.args[1]["inputs"].shape[0] // accum
  extra = big_step.args[1]["inputs"].shape[0] // accum - micro
  if extra <= 0:
    return {"max_micro_batch": None, "bytes_per_row": None}
  memory2 = plan_compile.step_memory(big_step)
  slope = (memory2["total"] - memory["total"]) / extra
  if slope <= 0:
    return {"max_micro_batch": None, "bytes_per_row": slope}
  fixed = memory["total"] - slope * micro
  unit = int(d.segments_per_lane) * plan_compile.data_parallel(s, devices)
  rows = int((usable - fixed) // slope) // unit * unit
  return {"max_micro_batch": max(rows, 0), "bytes_per_row": slope}


def _dump_dir(root: str, name: str) -> str:
  """A step's own dump directory under ``root`` ('' = no dump)."""
  return os.path.join(root, name) if root else ""


def plan_dtype(
    run: spec.Run,
    devices,
    dtype: str,
    flops: dict,
    usable: float,
    compiled: Any = None,
    dumps: str = "",
) -> dict[str, Any]:
  """Memory, fit and speed of the step in ``dtype`` (model.dtype).
  ``compiled``: the run's own step (``plan_compile.Step``), already
  compiled for its FLOPs, reused when ``dtype`` is the run's. ``dumps``:
  where the steps dump their buffer assignments (``plan.buffers``)."""
  s = run.settings
  variant = run.replace(dataclasses.replace(s.model, dtype=dtype))
  if compiled is not None and dtype == s.model.dtype:
    step = compiled
  else:
    step = plan_compile.build_step(variant, devices, _dump_dir(dumps, dtype))
  memory = plan_compile.step_memory(step)
  if step is compiled:  # compiled for the FLOPs: that compilation's time
    memory["seconds"] = flops.get("compile_seconds", memory["seconds"])
  out = {"memory": memory, "fits": memory["total"] <= usable}
  if step.dump_dir and "out_of_memory" not in memory:
    try:
      n = int(s.of(platforms.Plan).buffers)
      out["buffers"] = plan_buffers.largest(step.dump_dir, n)
    except FileNotFoundError:
      console.warn(
          "plan: the %s step came from the persistent compilation cache and "
          "dumped no buffer assignment: plan in a new process (memjax.main) "
          "to list its buffers",
          dtype,
      )
  if s.of(platforms.Plan).fit_batch:
    out.update(_fit(variant, devices, step, memory, usable))
  if not out["fits"]:
    out["proposal"] = plan_fit.propose(variant, devices, usable)
    console.info("plan: %s", plan_fit.describe(dtype, out["proposal"]))
  platform = platforms.get(s.of(platforms.Plan).platform)
  peak = platform.peak_bf16 if dtype == "bfloat16" else platform.peak_fp32
  seconds = flops["flops_per_device"] / (
      peak * float(s.of(platforms.Plan).utilization)
  )
  out["step_time_s"] = seconds
  out["tokens_per_s"] = step.tokens / seconds
  if s.of(platforms.Plan).eval_step:
    out["eval"] = plan_eval.plan_eval(variant, devices, usable, peak)
  return out


def plan(run: spec.Run) -> dict[str, Any]:
  """Compiles the run's train step for ``plan.*``; writes ``plan.json`` and
  ``plan.md`` in the workdir and returns the results."""
  start = time.time()
  s = run.settings
  platform = platforms.get(s.of(platforms.Plan).platform)
  devices, where = plan_compile.plan_devices(s)
  console.info("plan: %s on %s for %s", s.name, where, platforms.describe(s))
  with contextlib.ExitStack() as stack:
    dumps = ""
    if int(s.of(platforms.Plan).buffers):
      dumps = stack.enter_context(tempfile.TemporaryDirectory())
    results = _plan(run, devices, where, platform, dumps)
  results["seconds"] = time.time() - start
  return write(results, run.workdir)


def _plan(
    run: spec.Run, devices: list[Any], where: str, platform: Any, dumps: str
) -> dict[str, Any]:
  """The plan's results (``plan``), the steps' buffer assignments dumped
  under ``dumps`` when it is set."""
  s = run.settings
  step = plan_compile.build_step(run, devices, _dump_dir(dumps, "step"))
  flops = plan_compile.step_flops(step)
  formula = step_formula(step)
  fraction = (
      float(s.of(platforms.Plan).memory_fraction) or platform.memory_fraction
  )
  usable = platform.memory * fraction
  results = {
      "name": s.name,
      "platform": platform.name,
      "target": platforms.describe(s),
      "devices": len(devices),
      "compiled_on": where,
      "estimate": platform.name != "cpu" and "topology" not in where,
      "mesh": dict(step.mesh.shape),
      "vocab_size": plan_compile.vocab_size(s),
      "num_params": step.num_params,
      "tokens_per_step": step.tokens,
      "grad_accum": int(s.train.grad_accum),
      "flops": flops,
      "flops_per_token": flops["flops"] / step.tokens,
      "formula_flops_per_token": formula,
      "usable_memory_bytes": usable,
      "utilization": float(s.of(platforms.Plan).utilization),
      "dtypes": {},
  }
  for dtype in s.of(platforms.Plan).dtypes:
    results["dtypes"][dtype] = plan_dtype(
        run, devices, dtype, flops, usable, compiled=step, dumps=dumps
    )
  evals = [r["eval"] for r in results["dtypes"].values() if "eval" in r]
  if evals:
    results["eval_formula_flops_per_token"] = eval_formula(
        step, evals[0]["rows"], evals[0]["length"]
    )
  return results


def write(results: dict[str, Any], workdir: str) -> dict[str, Any]:
  """Writes ``plan.json`` and ``plan.md``; returns the mode's results."""
  paths.makedirs(workdir)
  path = paths.join(workdir, "plan.json")
  paths.write_json(path, results)
  table = markdown(results)
  paths.write_text(paths.join(workdir, "plan.md"), table + "\n")
  return dict(results, results_path=path, summary_lines=table.splitlines())


HEADER = (
    "| config | target | dtype | params | GFLOPs/token XLA (formula) | "
    "per device: params + opt + temp = total GiB | fits | max micro-batch "
    "| repeated | step s | tokens/s | compile s |\n"
    "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: "
    "| ---: |"
)


def rows(results: dict[str, Any]) -> list[str]:
  """The table rows of one plan, one per dtype (see ``HEADER``)."""
  gib = 2.0**30
  f = results["formula_flops_per_token"]
  flops = (
      f"{results['flops_per_token'] / 1e9:.4g} "
      f"({f['with_recompute'] / 1e9:.4g}; model {f['model'] / 1e9:.4g})"
  )
  target = _target(results)
  repeated = _repeated(results["flops"])
  out = []
  for dtype, r in results["dtypes"].items():
    m = r["memory"]
    compile_s = f"{m['seconds']:.0f}"
    mem = (
        f"{m['params'] / gib:.2f} + {m['opt_state'] / gib:.2f} + "
        f"{m['temporaries'] / gib:.2f} = {m['total'] / gib:.2f}"
    )
    fit = r.get("max_micro_batch")
    out.append(
        f"| {results['name']} | {target} | {dtype} | "
        f"{results['num_params'] / 1e6:.1f}M | {flops} | {mem} | "
        f"{'yes' if r['fits'] else 'no'} | {'-' if fit is None else fit} | "
        f"{repeated} | {r['step_time_s']:.3g} | {r['tokens_per_s']:.3g} | "
        f"{compile_s} |"
    )
  return out


EVAL_HEADER = (
    "| config | target | dtype | eval step: rows x positions | "
    "GFLOPs/token XLA (forward formula) | per device: params + temp = total "
    "GiB | fits | repeated | step s | tokens/s | compile s |\n"
    "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
)


def _repeated(flops: dict[str, Any]) -> str:
  """Per-device FLOPs x devices over the program's: 1 when no work
  repeats; "-" where unknown (no compiled program: the compiler refused
  it)."""
  return f"{flops['repeated']:.2f}" if "repeated" in flops else "-"


def _target(results: dict[str, Any]) -> str:
  """'8x h100 (est.)', 'v4-8 = 4x tpu_v4': what a row plans for."""
  target = f"{results['devices']}x {results['platform']}"
  slice_name = results.get("target", "").split(":")[0]
  if platforms.cloud_tpu(slice_name) is not None:
    target = f"{slice_name} = {target}"
  if results["estimate"]:
    target += " (est.)"
  return target


def eval_rows(results: dict[str, Any]) -> list[str]:
  """The evaluation step's table rows, one per dtype (``EVAL_HEADER``);
  none when the plan left it out (``plan.eval_step``)."""
  gib = 2.0**30
  formula = results.get("eval_formula_flops_per_token", 0.0)
  out = []
  for dtype, r in results["dtypes"].items():
    e = r.get("eval")
    if e is None:
      continue
    m = e["memory"]
    mem = (
        f"{m['params'] / gib:.2f} + {m['temporaries'] / gib:.2f} = "
        f"{m['total'] / gib:.2f}"
    )
    out.append(
        f"| {results['name']} | {_target(results)} | {dtype} | "
        f"{e['rows']} x {e['length']} | {e['flops_per_token'] / 1e9:.4g} "
        f"({formula / 1e9:.4g}) | {mem} | {'yes' if e['fits'] else 'no'} | "
        f"{_repeated(e['flops'])} | {e['step_time_s']:.3g} | "
        f"{e['tokens_per_s']:.3g} | {m['seconds']:.0f} |"
    )
  return out


def markdown(results: dict[str, Any]) -> str:
  """The plan as a markdown table (``HEADER`` and ``rows``), then what fits
  where a dtype does not as configured, then the evaluation step's table
  (``EVAL_HEADER`` and ``eval_rows``)."""
  lines = [HEADER] + rows(results)
  proposals = [
      plan_fit.describe(dtype, r["proposal"])
      for dtype, r in results["dtypes"].items()
      if "proposal" in r
  ]
  refused = [
      f"{dtype}{step}: the device's compiler refused the step: "
      f"{m['out_of_memory']}"
      for dtype, r in results["dtypes"].items()
      for step, m in (
          ("", r["memory"]),
          (" eval", r.get("eval", {}).get("memory", {})),
      )
      if "out_of_memory" in m
  ]
  if proposals or refused:
    lines += ["", *(f"* {p}" for p in refused + proposals)]
  evals = eval_rows(results)
  if evals:
    lines += ["", EVAL_HEADER, *evals]
  for dtype, r in results["dtypes"].items():
    if r.get("buffers"):
      lines += ["", *plan_buffers.rows(r["buffers"], dtype)]
  return "\n".join(lines)
