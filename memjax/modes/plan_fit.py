"""What ``--mode=plan`` proposes when a step does not fit its target.

A step's memory per device grows linearly with its micro-batch (the
temporaries; the parameters and optimiser state stay). The proposal takes
the settings in this order, the cheapest in speed first:

1. more micro-batches per step (``train.grad_accum``) at the same global
   batch, so each micro-batch is smaller;
2. the same, with the blocks rematerialised (``model.remat``), keeping the
   matmul outputs without batch dimensions first
   (``model.remat_policy=dots_no_batch``), then nothing (``full``).

For each, the step is compiled at the smallest micro-batch the mesh can
split (``data.segments_per_lane`` rows per data-parallel device) and at
twice that, the line through the two totals gives the largest micro-batch
that fits, and the step with the ``train.grad_accum`` it implies is
compiled once more to check. When none fits, the micro-batch cannot shrink
any further: the proposal says so (more devices, or a mesh that shards the
parameters, ``mesh.fsdp``, are what is left).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from memjax import errors
from memjax import settings as settings_lib
from memjax.modes import plan_compile
from memjax.run import spec

# (overrides, model fields) tried in order after the run's own settings.
REMAT_OPTIONS = (
    (("--config.model.remat=True",
      "--config.model.remat_policy=dots_no_batch"),
     {"remat": True, "remat_policy": "dots_no_batch"}),
    (("--config.model.remat=True", "--config.model.remat_policy=full"),
     {"remat": True, "remat_policy": "full"}),
)  # fmt: skip


def _with(run: spec.Run, accum: int, **model: Any) -> spec.Run:
  """``run`` with ``train.grad_accum`` = ``accum`` and ``model`` fields."""
  s = run.settings
  return run.replace(
      dataclasses.replace(s.train, grad_accum=int(accum)),
      dataclasses.replace(s.model, **model),
  )


def _total(run: spec.Run, devices: list[Any]) -> Optional[float]:
  """Per-device bytes of the compiled step; None if the mesh refuses it."""
  try:
    step = plan_compile.build_step(run, devices)
  except errors.UserError:
    return None
  return float(plan_compile.step_memory(step)["total"])


def _unit(s: settings_lib.Settings, devices: list[Any]) -> int:
  """Rows of the smallest micro-batch the mesh splits."""
  return int(s.data.segments_per_lane) * plan_compile.data_parallel(s, devices)


def propose(run: spec.Run, devices: list[Any], usable: float) -> dict[str, Any]:
  """Overrides with which the step fits ``usable`` bytes per device.

  Returns:
    {'overrides': [--config... flags], 'micro_batch': rows,
    'total_bytes': the checked total} of the first setting that fits, or
    {'overrides': None, 'reason': ...}.
  """
  s = run.settings
  batch, unit = int(s.data.batch_size), _unit(s, devices)
  if batch % unit:
    return {"overrides": None, "reason": f"the batch of {batch} rows does "
            f"not split into micro-batches of {unit}"}  # fmt: skip
  options = [((), {})] + (list(REMAT_OPTIONS) if not s.model.remat else [])
  for flags, model in options:
    smallest = _total(_with(run, batch // unit, **model), devices)
    if smallest is None or smallest > usable:
      continue
    rows = unit
    if batch >= 2 * unit and batch % (2 * unit) == 0:
      double = _total(_with(run, batch // (2 * unit), **model), devices)
      if double is not None and double > smallest:
        slope = (double - smallest) / unit
        rows = int((usable - smallest) // slope) // unit * unit + unit
    # The largest micro-batch under the line that divides the batch.
    rows = max(
        (r for r in range(unit, min(rows, batch) + 1, unit) if batch % r == 0),
        default=unit,
    )
    while True:
      total = _total(_with(run, batch // rows, **model), devices)
      if total is not None and total <= usable:
        break
      smaller = [r for r in range(unit, rows, unit) if batch % r == 0]
      if not smaller:
        total = smallest
        rows = unit
        break
      rows = smaller[-1]
    accum = batch // rows
    overrides = list(flags)
    if accum != int(s.train.grad_accum):
      overrides.insert(0, f"--config.train.grad_accum={accum}")
    return {"overrides": overrides, "micro_batch": rows, "total_bytes": total}
  return {"overrides": None, "reason": (
      f"even a micro-batch of {unit} rows with every block rematerialised "
      "does not fit: use more devices or shard the parameters "
      "(--config.mesh.fsdp)"
  )}  # fmt: skip


def describe(dtype: str, proposal: dict[str, Any]) -> str:
  """One line: the overrides that fit, or why none does."""
  if proposal.get("overrides") is None:
    return f"{dtype}: does not fit; {proposal['reason']}"
  if not proposal["overrides"]:
    return f"{dtype}: fits as configured"
  return (
      f"{dtype}: fits with {' '.join(proposal['overrides'])} (micro-batch "
      f"{proposal['micro_batch']} rows, {proposal['total_bytes'] / 2**30:.2f} "
      "GiB per device)"
  )
