"""Device mesh and logical-axis rules.

Models name logical axes only; this module maps them onto a
``jax.sharding.Mesh`` with axes ``('data', 'fsdp', 'tensor', 'memory')``:

* ``batch`` is split over ``data``, ``fsdp`` and ``memory`` (all three are
  data-parallel for activations);
* parameters' ``embed`` axis is split over ``fsdp`` (ZeRO-3 style: each fsdp
  shard owns a slice of every weight, gathered for use);
* ``heads``, ``mlp`` and ``vocab`` are split over ``tensor`` (Megatron style);
* ``memory_slots`` (a memory table's rows) is split over ``memory`` and
  ``tensor``: on ``memory`` alone the rest of the model stays data-parallel
  while each device holds 1/memory of the table and its optimiser state.
  A memory that reads such a table says how (the product-key memory reads
  its rows where they live and adds the outputs over the devices).

Flax resolves a mesh axis used twice in one array by keeping its first use,
so activations [batch, length, embed] are split on batch only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from memjax import errors
from memjax import settings as settings_lib

MESH_AXES = ("data", "fsdp", "tensor", "memory")
# The mesh axes a batch's rows are split over.
BATCH_AXES = ("data", "fsdp", "memory")

LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("memory_slots", ("memory", "tensor")),
    ("kv", None),
    ("length", None),
    ("mem", None),
    # Stacked layers (model.scan_layers): every device holds every layer.
    ("layers", None),
)


MeshError = errors.MeshError


def mesh_shape(spec: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
  """Resolves a {'data', 'fsdp', 'tensor', 'memory'} spec with at most one
  -1.

  Args:
    spec: sizes per mesh axis; -1 means "all remaining devices".
    num_devices: devices available.

  Returns:
    (data, fsdp, tensor, memory) sizes whose product is num_devices.

  Raises:
    MeshError: unknown axis, several -1, or a product that does not match.
  """
  unknown = set(spec) - set(MESH_AXES)
  if unknown:
    raise MeshError(f"unknown mesh axes {sorted(unknown)}; use {MESH_AXES}")
  sizes = [int(spec.get(a, 1)) for a in MESH_AXES]
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1:
    raise MeshError("at most one mesh axis may be -1 (fill)")
  fixed = int(np.prod([s for s in sizes if s != -1]))
  if free:
    if num_devices % fixed:
      raise MeshError(
          f"mesh {dict(zip(MESH_AXES, sizes))} cannot fill {num_devices} "
          f"devices: {num_devices} is not a multiple of {fixed}"
      )
    sizes[free[0]] = num_devices // fixed
  if int(np.prod(sizes)) != num_devices:
    raise MeshError(
        f"mesh {dict(zip(MESH_AXES, sizes))} has {int(np.prod(sizes))} "
        f"devices but {num_devices} are available; set --config.mesh.* so "
        f"the product is {num_devices}"
    )
  return tuple(sizes)


def make_mesh(
    spec: Mapping[str, int], devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """Builds the ``MESH_AXES`` mesh from a config spec."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(spec, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def mesh_of(
    mesh: settings_lib.Mesh, spec: Mapping[str, int] | None = None
) -> Mesh:
  """The mesh of the ``mesh`` settings, or of ``spec``: an explicit
  ``spec`` without -1 may use the first devices only (e.g. {'data': 1})."""
  if spec is None:
    return make_mesh(dataclasses.asdict(mesh))
  sizes = [int(spec.get(a, 1)) for a in MESH_AXES]
  devices = jax.devices()
  if -1 not in sizes and 0 < int(np.prod(sizes)) < len(devices):
    devices = devices[: int(np.prod(sizes))]
  return make_mesh(dict(spec), devices)


def check_batch(
    mesh: Mesh,
    batch_size: int,
    what: str = "batch size",
    rows_per_unit: int = 1,
) -> None:
  """Raises MeshError unless the data-parallel size divides the batch.

  Args:
    mesh: the device mesh.
    batch_size: the rows split over the data-parallel devices.
    what: how the message names them.
    rows_per_unit: ``data.batch_size`` rows per unit of ``batch_size`` (the
      micro-batches of a step, and the segments of a lane): the message
      proposes a ``data.batch_size`` that divides.
  """
  dp = data_parallel(mesh)
  if batch_size % dp:
    fits = -(-batch_size // dp) * dp * rows_per_unit
    share = math.gcd(batch_size, dp)
    sizes = " x ".join(f"{a}={mesh.shape.get(a, 1)}" for a in BATCH_AXES)
    raise MeshError(
        f"{what} {batch_size} is not divisible by the data-parallel mesh size "
        f"{dp} ({sizes}): set "
        f"--config.data.batch_size={fits}, or split fewer devices over the "
        f"batch (e.g. --config.mesh.data={share} --config.mesh.fsdp=1 "
        f"--config.mesh.memory=1 --config.mesh.tensor={mesh.size // share})"
    )


def data_parallel(mesh: Mesh) -> int:
  """Devices a batch's rows are split over (``BATCH_AXES``; a mesh made
  without some of them counts them as 1)."""
  return int(np.prod([mesh.shape.get(a, 1) for a in BATCH_AXES]))


def logical_sharding(mesh: Mesh, logical_spec: Any, rules=LOGICAL_RULES) -> Any:
  """Maps a pytree of logical PartitionSpecs to NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_spec, mesh, rules)


def divisible(shardings: Any, shapes: Any) -> Any:
  """``shardings`` with every dimension that its mesh axes do not divide
  left whole on them.

  A parameter too small for the mesh (an adaptive softmax's tail projection
  of width 2 on 8 ``fsdp`` devices) is then held whole by every device
  instead of refusing the mesh: its bytes are negligible, and a divisible
  dimension keeps its split.

  Args:
    shardings: a tree of ``NamedSharding``s.
    shapes: the same tree (or one with it as a prefix) of arrays or
      ``jax.ShapeDtypeStruct``s.
  """

  def fit(sharding: Any, x: Any) -> Any:
    if not isinstance(sharding, NamedSharding) or not hasattr(x, "shape"):
      return sharding
    spec = list(sharding.spec) + [None] * (len(x.shape) - len(sharding.spec))
    for i, axes in enumerate(spec[: len(x.shape)]):
      names = (axes,) if isinstance(axes, str) else tuple(axes or ())
      size = int(np.prod([sharding.mesh.shape[a] for a in names]))
      if x.shape[i] % size:
        spec[i] = None
    return NamedSharding(sharding.mesh, P(*spec[: len(x.shape)]))

  return jax.tree.map(
      fit,
      shardings,
      shapes,
      is_leaf=lambda x: isinstance(x, NamedSharding) or x is None,
  )


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Sharding of an array whose leading axis is the batch."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def put_global_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict:
  """Places a host batch (the same global batch on every host) on the mesh.

  Every process computes the global batch deterministically from the step, so
  each device simply takes its slice; this works on one host and on many.
  ``jax.make_array_from_callback`` asks only for the slices of the calling
  process's own devices, so with several processes each one copies only the
  rows its devices hold, and the result is one global array.
  """
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    sharding = batch_sharding(mesh, v.ndim) if v.ndim else replicated(mesh)
    out[k] = jax.make_array_from_callback(
        v.shape, sharding, lambda idx, v=v: v[idx]
    )
  return out


@contextlib.contextmanager
def mesh_rules(mesh: Mesh, rules=LOGICAL_RULES):
  """Activates the mesh and the logical-axis rules while tracing.

  Inside, the models' ``nn.with_logical_constraint`` annotations become
  sharding constraints on ``mesh``; outside, they are no-ops.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


class MeshFunction:
  """A jitted function whose every trace runs under ``mesh_rules``.

  Calling it runs the function; ``memory_bytes`` compiles it for the given
  arguments and returns XLA's estimate of the device memory one call needs.
  """

  def __init__(self, jitted, mesh: Mesh, rules=LOGICAL_RULES):
    self.jitted = jitted
    self.mesh = mesh
    self.rules = rules

  def __call__(self, *args, **kwargs):
    with mesh_rules(self.mesh, self.rules):
      return self.jitted(*args, **kwargs)

  def lower(self, *args, **kwargs) -> Any:
    """``jax.jit(...).lower`` under the mesh rules: arrays or
    ``jax.ShapeDtypeStruct`` (with shardings) as arguments."""
    with mesh_rules(self.mesh, self.rules):
      return self.jitted.lower(*args, **kwargs)

  def memory_bytes(self, *args, **kwargs) -> int:
    """Arguments + outputs + temporaries - donated aliases, in bytes."""
    with mesh_rules(self.mesh, self.rules):
      compiled = self.jitted.lower(*args, **kwargs).compile()
    ma = compiled.memory_analysis()
    return int(
        ma.argument_size_in_bytes
        + ma.output_size_in_bytes
        + ma.temp_size_in_bytes
        - ma.alias_size_in_bytes
    )


def jit(
    fn: Any, mesh: Mesh, rules=LOGICAL_RULES, **jit_kwargs: Any
) -> MeshFunction:
  """``jax.jit(fn, **jit_kwargs)`` whose every trace runs under ``mesh_rules``.

  The one place a function is jitted for a mesh: the train step, every
  scorer of ``memjax.eval`` and the methods' embedding and feature passes.
  """
  return MeshFunction(jax.jit(fn, **jit_kwargs), mesh, rules)


def check_batch_fits(
    s: settings_lib.Settings, carries_memory: bool, mesh: Mesh
) -> None:
  """Raises MeshError/ConfigError for batches the mesh or lanes cannot split.

  Args:
    s: the run's settings.
    carries_memory: the model carries a recurrent memory across steps.
    mesh: the device mesh.
  """
  m, d, accum = s.model, s.data, int(s.train.grad_accum)
  if not carries_memory:
    check_batch(
        mesh,
        d.batch_size // accum,
        "micro-batch size (data.batch_size / train.grad_accum)",
        accum,
    )
    return
  if d.batching != "consecutive":
    raise errors.ConfigError(
        f"model.attention={m.attention!r} with model.mem_len={m.mem_len} "
        "carries memory across steps: set data.batching='consecutive' (got "
        f"{d.batching!r})"
    )
  lanes = d.batch_size // max(int(d.segments_per_lane), 1)
  if lanes % accum:
    raise errors.ConfigError(
        f"{lanes} lanes (data.batch_size / data.segments_per_lane) are not "
        f"divisible by train.grad_accum {accum}: micro-batches must hold "
        "whole lanes"
    )
  check_batch(
      mesh,
      lanes // accum,
      "lanes per micro-batch",
      accum * max(int(d.segments_per_lane), 1),
  )
