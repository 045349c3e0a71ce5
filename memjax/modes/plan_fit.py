"""What ``--mode=plan`` proposes when a step does not fit its target.

A step's memory per device grows linearly with its micro-batch (the
temporaries; the parameters and optimiser state stay). The proposal takes
the settings in this order, the cheapest in speed first:

1. more micro-batches per step (``train.grad_accum``) at the same global
   batch, so each micro-batch is smaller;
2. the same, with the blocks rematerialised (``model.remat``), keeping the
   matmul outputs without batch dimensions first
   (``model.remat_policy=dots_no_batch``), then nothing (``full``);
3. when data parallelism has run out (one row per data-parallel device
   still does not fit), the same again on a mesh whose data-parallel
   devices shard the parameters and optimiser state (ZeRO-3 style,
   ``mesh.fsdp``; ``memjax.sharding``): the rows still split over them.

For each, the step is compiled at the smallest micro-batch the mesh can
split (``data.segments_per_lane`` rows per data-parallel device) and at
twice that, the line through the two totals gives the largest micro-batch
that fits, and the step with the ``train.grad_accum`` it implies is
compiled once more to check. When none fits, the proposal says so: more
devices, or tensor parallelism (``mesh.tensor``), are what is left.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from memjax import errors
from memjax import settings as settings_lib
from memjax import sharding as sharding_lib
from memjax.modes import plan_compile
from memjax.run import spec

# (overrides, model fields) tried in order after the run's own settings.
REMAT_OPTIONS = (
    (
        (
            "--config.model.remat=True",
            "--config.model.remat_policy=dots_no_batch",
        ),
        {"remat": True, "remat_policy": "dots_no_batch"},
    ),
    (
        ("--config.model.remat=True", "--config.model.remat_policy=full"),
        {"remat": True, "remat_policy": "full"},
    ),
)


def _with(
    run: spec.Run, accum: int, mesh: Optional[dict[str, int]] = None, **model
) -> spec.Run:
  """``run`` with ``train.grad_accum`` = ``accum``, ``mesh`` sizes and
  ``model`` fields."""
  s = run.settings
  sections = [
      dataclasses.replace(s.train, grad_accum=int(accum)),
      dataclasses.replace(s.model, **model),
  ]
  if mesh:
    sections.append(dataclasses.replace(s.mesh, **mesh))
  return run.replace(*sections)


def mesh_options(
    s: settings_lib.Settings, devices: list[Any]
) -> list[tuple[tuple[str, ...], dict[str, int]]]:
  """(overrides, mesh sizes) tried in turn: the run's own mesh, then its
  data-parallel devices on ``fsdp`` (each holds 1/fsdp of the parameters
  and optimiser state; the rows still split over them)."""
  options = [((), {})]
  sizes = dict(
      zip(
          sharding_lib.MESH_AXES,
          sharding_lib.mesh_shape(dataclasses.asdict(s.mesh), len(devices)),
      )
  )
  dp = sizes["data"] * sizes["fsdp"]
  if dp > 1 and sizes["data"] > 1:
    options.append(
        (
            ("--config.mesh.data=1", f"--config.mesh.fsdp={dp}"),
            {"data": 1, "fsdp": dp},
        )
    )
  return options


_TOTALS: dict[Any, Optional[float]] = {}


def _total(run: spec.Run, devices: list[Any]) -> Optional[float]:
  """Per-device bytes of the compiled step; None if the mesh refuses it.
  Remembered per (settings, devices): a proposal asks for the same step
  more than once."""
  key = (repr(run.settings), tuple(str(d) for d in devices))
  if key not in _TOTALS:
    try:
      step = plan_compile.build_step(run, devices)
    except errors.UserError:
      _TOTALS[key] = None
    else:
      _TOTALS[key] = float(plan_compile.step_memory(step)["total"])
  return _TOTALS[key]


def _state_bytes(run: spec.Run, devices: list[Any]) -> Optional[float]:
  """Per-device bytes of the parameters and optimiser state (no
  compilation); None if the mesh refuses the run."""
  try:
    step = plan_compile.build_step(run, devices)
  except errors.UserError:
    return None
  return float(sum(step.state_bytes.values()))


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
    return {
        "overrides": None,
        "reason": f"the batch of {batch} rows does "
        f"not split into micro-batches of {unit}",
    }
  remat = [((), {})] + (list(REMAT_OPTIONS) if not s.model.remat else [])
  state = _state_bytes(run, devices)
  for mesh_flags, mesh in mesh_options(s, devices):
    if state is not None and state / (mesh.get("fsdp") or 1) > usable:
      # The state's shards, arguments of the step, alone do not fit:
      # nothing compiled. (The rest of the total is not bounded below by
      # the run's own mesh: a device's compiler that refuses a step counts
      # its temporaries differently, so each option is compiled.)
      continue
    for flags, model in remat:
      found = _largest_micro_batch(run, devices, usable, mesh, model)
      if found is None:
        continue
      rows, total = found
      accum = batch // rows
      overrides = list(mesh_flags) + list(flags)
      if accum != int(s.train.grad_accum):
        overrides.insert(0, f"--config.train.grad_accum={accum}")
      return {"overrides": overrides, "micro_batch": rows, "total_bytes": total}
  return {
      "overrides": None,
      "reason": (
          f"even a micro-batch of {unit} rows with every block rematerialised "
          "and the parameters sharded over the data-parallel devices "
          "(--config.mesh.fsdp) does not fit: use more devices, or split the "
          "layers over --config.mesh.tensor"
      ),
  }


def _largest_micro_batch(
    run: spec.Run,
    devices: list[Any],
    usable: float,
    mesh: dict[str, int],
    model: dict[str, Any],
) -> Optional[tuple[int, float]]:
  """(rows, checked bytes per device) of the largest micro-batch that fits
  with ``mesh`` and ``model`` overrides, or None when even the smallest
  does not."""
  s = run.settings
  batch, unit = int(s.data.batch_size), _unit(s, devices)
  smallest = _total(_with(run, batch // unit, mesh, **model), devices)
  if smallest is None or smallest > usable:
    return None
  rows = unit
  if batch >= 2 * unit and batch % (2 * unit) == 0:
    double = _total(_with(run, batch // (2 * unit), mesh, **model), devices)
    if double is not None and double > smallest:
      slope = (double - smallest) / unit
      rows = int((usable - smallest) // slope) // unit * unit + unit
  # The largest micro-batch under the line that divides the batch.
  rows = max(
      (r for r in range(unit, min(rows, batch) + 1, unit) if batch % r == 0),
      default=unit,
  )
  while True:
    total = _total(_with(run, batch // rows, mesh, **model), devices)
    if total is not None and total <= usable:
      return rows, total
    smaller = [r for r in range(unit, rows, unit) if batch % r == 0]
    if not smaller:
      return unit, smallest
    rows = smaller[-1]


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
