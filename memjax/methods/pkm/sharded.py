"""The memory read where the table's rows are split over devices.

When the logical axis ``memory_slots`` resolves, under the active mesh and
rules (``memjax.sharding``), to mesh axes of more than one device, every
device holds a contiguous block of S / m rows of the values and of their
optimiser state. Gathering rows from such a table with ``jnp.take`` lets
the compiler move the whole table, or every token, to every device. This
read, a ``shard_map`` as Berges et al. ("Memory Layers at Scale") shard
their memory, moves only the small things:

1. the positions' slots and weights, [b, T, H*k], are gathered over the
   memory axes that also split the batch (the ``memory`` mesh axis), so
   each device sees every position of its group;
2. each device reads the rows it holds (``bag.read``, the weight of a slot
   held elsewhere set to 0) for all those positions;
3. the partial outputs are summed over the memory axes and, over the ones
   that split the batch, scattered back to the devices whose positions
   they are (``psum_scatter``).

Backwards, the values' gradient stays on the device that holds the rows
(no all-reduce of a [S, V] gradient) and the weights' gradients return to
their positions by the transposes of steps 1 and 3.

The module asks only the context: the mesh set by ``jax.set_mesh`` and
the logical-axis rules; with neither, or with the rows on one device, the
read is the plain ``bag.read``.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from memjax.methods.pkm import bag

Array = jax.Array


def _axes(logical: str) -> tuple[str, ...]:
  """Mesh axes of one logical axis under the active rules (() if none)."""
  axes = nn.logical_to_mesh_axes((logical,))[0]
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def placement() -> tuple[jax.sharding.AbstractMesh | None, tuple[str, ...]]:
  """(mesh, the mesh axes of size > 1 that split the memory's rows)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return None, ()
  try:
    axes = _axes("memory_slots")
  except ValueError:  # No rules are active.
    return None, ()
  return mesh, tuple(a for a in axes if mesh.shape[a] > 1)


def read(values: Array, slots: Array, weights: Array, group: int = 0) -> Array:
  """``bag.read`` of a table whose rows may be split over devices.

  Args:
    values: [S, V] the table (its rows split over the memory axes).
    slots: [B, ..., J] rows to read, the leading axis the batch.
    weights: [B, ..., J] their weights.
    group: columns per step of the local ``bag.read``.

  Returns:
    [B, ..., V], as ``bag.read(values, slots, weights)``.
  """
  mesh, mem = placement()
  if not mem:
    return bag.read(values, slots, weights, group)
  batch = tuple(a for a in _axes("batch") if mesh.shape[a] > 1)
  if slots.shape[0] % math.prod(mesh.shape[a] for a in batch):
    batch = ()  # Rows the batch axes cannot split (init's one example).
  gathered = tuple(a for a in mem if a in batch)
  summed = tuple(a for a in mem if a not in batch)
  rows_each = values.shape[0] // math.prod(mesh.shape[a] for a in mem)
  tail = (None,) * (slots.ndim - 1)

  def local(values, slots, weights):
    if gathered:
      slots = jax.lax.all_gather(slots, gathered, axis=0, tiled=True)
      weights = jax.lax.all_gather(weights, gathered, axis=0, tiled=True)
    # The table and the weights vary over every axis the read does: the
    # casts' transposes add the gradients of the table over the devices
    # that hold the same rows, and of the weights over the memory axes.
    values = jax.lax.pcast(
        values, tuple(a for a in batch if a not in mem), to="varying"
    )
    weights = jax.lax.pcast(weights, summed, to="varying")
    first = jax.lax.axis_index(mem) * rows_each
    here = (slots >= first) & (slots < first + rows_each)
    idx = jnp.where(here, slots - first, 0)
    out = bag.read(values, idx, jnp.where(here, weights, 0), group)
    if summed:
      out = jax.lax.psum(out, summed)
    if gathered:
      out = jax.lax.psum_scatter(out, gathered, scatter_dimension=0, tiled=True)
    return out

  spec = P(batch or None, *tail)
  return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(P(mem, None), spec, spec),
      out_specs=spec,
  )(values, slots, weights)
