"""The evaluation step of ``--mode=plan``: the scorer's forward, compiled
abstractly as ``plan_compile`` compiles the train step.

The step is the one the scoring layer jits (``memjax.eval``), picked by
``eval.scorer.scorer_for`` as every mode picks it:

* a model that carries memory (Transformer-XL, LaMemo): the stream
  scorer's scan (``streams.StreamScorer``) over one segment of
  ``eval.lanes`` lanes (padded to the data-parallel devices) of L
  predictions (``eval.segment_len`` or ``data.seq_len``), its memory
  carried in and out;
* otherwise the forward over a batch of rows (``rows.Scorer`` rows, which
  the window scorer and ``--mode=datastore`` run): ``eval.batch_size``
  rows (rounded up to the data-parallel devices) of ``eval.window_len``
  tokens for a language model without extra inputs, else of the training
  batch's shapes (MLM, translation, MARGE's sources).

No optimiser state and no gradients: the parameters (their shards as the
run places them) and the batch are the arguments. A testing memory's sums
(``eval_memory``: TRIME's M_long, an external datastore) are not part of
it: the forward is the whole of an evaluation without one and of building
a datastore (which keeps the keys the forward computes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from memjax import sharding as sharding_lib
from memjax.eval import rows as rows_lib
from memjax.eval import scorer as scorer_lib
from memjax.eval import streams
from memjax.modes import plan_compile
from memjax.modes import platforms
from memjax.models import variables as model_vars
from memjax.run import spec
from memjax.run import step as step_lib


def _shaped(shape: tuple[int, ...], dtype: Any, mesh: Any, lead: int = 0):
  """A ShapeDtypeStruct split over the data-parallel devices on its axis
  ``lead`` (the rows; 1 for the stream scorer's [segments, lanes, ...])."""
  spec_ = [None] * len(shape)
  spec_[lead] = sharding_lib.BATCH_AXES
  sharding = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(*spec_)
  )
  return jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=sharding)


def _rows_batch(run: spec.Run, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
  """The rows of one evaluation batch (see the module doc)."""
  s = run.settings
  size = rows_lib.batch_rows(int(s.eval.batch_size), mesh)
  names = {"inputs", "targets", "weights", *run.extra_inputs}
  shapes = run.batch_shapes(mesh.size)
  window = s.task == "lm" and not run.extra_inputs
  out = {}
  for key, (shape, dtype) in shapes.items():
    if key not in names:
      continue
    rest = tuple(shape[1:])
    if window:
      rest = (int(s.eval.window_len),) + rest[1:]
    out[key] = _shaped((size,) + rest, dtype, mesh)
  if "weights" not in out:
    out["weights"] = _shaped(out["targets"].shape, np.float32, mesh)
  return out


def _stream_args(scorer: streams.StreamScorer, params: Any) -> tuple:
  """(params, memory, one segment) of the stream scorer's scan."""
  mesh, lanes, length = scorer.mesh, scorer.padded_lanes, scorer.segment_len
  memory = jax.eval_shape(lambda: scorer.model.init_memory(lanes))
  memory = jax.tree.map(
      lambda x: _shaped(x.shape, x.dtype, mesh) if x.ndim else x, memory
  )
  segment = {
      k: _shaped((1, lanes, length), d, mesh, lead=1)
      for k, d in (
          ("inputs", np.int32),
          ("targets", np.int32),
          ("weights", np.float32),
      )
  }
  segment["reset"] = _shaped((1, lanes), np.bool_, mesh, lead=1)
  return params, memory, segment


def build_eval_step(run: spec.Run, devices: list[Any]) -> plan_compile.Step:
  """The evaluation step of ``run`` on ``devices``, with abstract
  arguments (a ``plan_compile.Step``: ``step_flops`` and ``step_memory``
  take it; its ``state_bytes`` hold the parameters' shards, no optimiser
  state; ``tokens`` the positions it runs)."""
  s = run.settings
  mesh = sharding_lib.make_mesh(dataclasses.asdict(s.mesh), devices)
  model = run.model(plan_compile.vocab_size(s))
  params, state = step_lib.abstract_variables(
      model, mesh, run.state_collections()
  )
  variables = model_vars.as_variables(params, state)
  scorer = scorer_lib.scorer_for(run.scoring(model, mesh))
  if isinstance(scorer, streams.StreamScorer):
    scorer.chunk = 1
    args = _stream_args(scorer, variables)
    make_fn = scorer._scan  # pylint: disable=protected-access
    tokens = int(np.prod(args[2]["inputs"].shape))
  else:
    batch = _rows_batch(run, mesh)
    names = tuple(sorted(batch))
    make_fn = lambda: scorer._rows_fn(  # pylint: disable=protected-access
        names, (), ()
    )
    args = (variables, batch)
    tokens = int(np.prod(batch["inputs"].shape))
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  state_bytes = {
      "params": plan_compile.per_device_bytes(variables),
      "opt_state": 0,
  }
  return plan_compile.Step(
      run, mesh, make_fn, args, num_params, state_bytes, tokens
  )


def eval_shape(step: plan_compile.Step) -> tuple[int, int]:
  """(rows, positions per row) of an evaluation step's batch."""
  inputs = step.args[-1]["inputs"].shape
  return int(inputs[-2]), int(inputs[-1])


def plan_eval(
    run: spec.Run, devices: list[Any], usable: float, peak: float
) -> dict[str, Any]:
  """FLOPs, memory and speed of the evaluation step of ``run``.

  Args:
    run: the run in the planned ``model.dtype``.
    devices: the planned devices.
    usable: usable bytes per device.
    peak: the platform's FLOP/s for the dtype.

  Returns:
    'rows', 'length' (positions per row), 'tokens' (positions per step),
    'flops' (``plan_compile.step_flops``), 'flops_per_token',
    'memory' (``plan_compile.step_memory``), 'fits', 'step_time_s' and
    'tokens_per_s' at ``plan.utilization`` of ``peak``.
  """
  step = build_eval_step(run, devices)
  flops = plan_compile.step_flops(step)
  memory = plan_compile.step_memory(step)
  memory["seconds"] = flops["compile_seconds"]
  rows, length = eval_shape(step)
  utilization = float(run.settings.of(platforms.Plan).utilization)
  seconds = flops["flops_per_device"] / (peak * utilization)
  return {
      "rows": rows,
      "length": length,
      "tokens": step.tokens,
      "flops": flops,
      "flops_per_token": flops["flops"] / step.tokens,
      "memory": memory,
      "fits": memory["total"] <= usable,
      "step_time_s": seconds,
      "tokens_per_s": step.tokens / seconds,
  }
