"""The memory's read as one operation: a weighted bag of value rows.

``read(values, slots, weights)`` computes, for every position n,

    out[n] = sum_j weights[n, j] * values[slots[n, j]]

the sum over a memory's H heads times k slots (J = H*k). Written as
``jnp.take`` then an einsum, XLA holds the gathered rows, a
[..., J, V] array, alive for the product and again for its gradient, which
scatters an array of the same shape back into the table: at BERT-base's
batch that is tens of gigabytes per memory layer, while the inputs and the
output are only [..., J] and [..., V].

Why our own: JAX, Flax and Optax offer no embedding bag (PyTorch's
``nn.EmbeddingBag`` is the operation Berges et al. write kernels for). So
the read is a ``jax.custom_vjp`` whose forward and backward loop over the J
columns in groups of ``group``: each step gathers [..., group, V] rows and
adds their weighted sum into the output, or, backwards, takes the weights'
gradient from the same rows and scatter-adds ``w * g`` into the values'
gradient. The largest temporary is [..., group, V], never [..., J, V],
and the leading axes (rows, then positions) are never flattened, so a batch
split over devices stays split (no device repeats another's reads).

The values' gradient is dense, [slots, V], the table's own shape: at the
base batch nearly every slot is read (``docs/pkm.md``), so a sparse
gradient would save nothing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


def _columns(x: Array, i: Array, group: int) -> Array:
  """Columns [i*group, (i+1)*group) of the last axis of ``x``."""
  return jax.lax.dynamic_slice_in_dim(x, i * group, group, axis=-1)


def _forward(values: Array, slots: Array, weights: Array, group: int) -> Array:
  """The read, accumulated in float32: [..., V]."""
  w32 = weights.astype(jnp.float32)

  def part(i):
    rows = jnp.take(values, _columns(slots, i, group), axis=0)
    return jnp.einsum(
        "...g,...gv->...v", _columns(w32, i, group), rows.astype(jnp.float32)
    )

  # The first group starts the sum: a carry built from the inputs varies
  # over the same devices they do (inside ``shard_map``).
  steps = slots.shape[-1] // group
  return jax.lax.fori_loop(1, steps, lambda i, out: out + part(i), part(0))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _read(values: Array, slots: Array, weights: Array, group: int) -> Array:
  return _forward(values, slots, weights, group).astype(weights.dtype)


def _read_fwd(values, slots, weights, group):
  out = _forward(values, slots, weights, group).astype(weights.dtype)
  return out, (values, slots, weights)


def _read_bwd(group, residuals, g):
  """Cotangents of (values, slots, weights); the slots get none."""
  values, slots, weights = residuals
  g32 = g.astype(jnp.float32)
  w32 = weights.astype(jnp.float32)

  def step(i, carry):
    dv, dw = carry
    s = _columns(slots, i, group)
    rows = jnp.take(values, s, axis=0).astype(jnp.float32)  # [..., g, V]
    dw_i = jnp.einsum("...v,...gv->...g", g32, rows)
    dw = jax.lax.dynamic_update_slice_in_dim(dw, dw_i, i * group, axis=-1)
    update = _columns(w32, i, group)[..., None] * g32[..., None, :]
    return dv.at[s].add(update), dw

  zeros = (jnp.zeros_like(values, jnp.float32), jnp.zeros_like(w32))
  steps = slots.shape[-1] // group
  dv, dw = jax.lax.fori_loop(0, steps, step, zeros)
  return dv.astype(values.dtype), None, dw.astype(weights.dtype)


_read.defvjp(_read_fwd, _read_bwd)


def read(values: Array, slots: Array, weights: Array, group: int = 0) -> Array:
  """``sum_j weights[..., j] * values[slots[..., j]]``.

  Args:
    values: [S, V] the table.
    slots: [..., J] int rows of ``values`` to read (repeats allowed).
    weights: [..., J] their weights; the output takes their dtype.
    group: columns gathered per step (0 = the largest divisor of J that is
      at most 8). Memory grows with it, the number of steps falls.

  Returns:
    [..., V]. Differentiable in ``values`` and ``weights``.
  """
  if slots.shape != weights.shape:
    raise ValueError(
        f"slots {slots.shape} and weights {weights.shape} must match"
    )
  j = slots.shape[-1]
  if group <= 0:
    group = max(d for d in range(1, min(j, 8) + 1) if j % d == 0)
  if j % group:
    raise ValueError(f"group {group} must divide the {j} columns")
  return _read(values, slots.astype(jnp.int32), weights, group)


def gather_read(values: Array, slots: Array, weights: Array) -> Array:
  """The same read through ``jnp.take``: the [..., J, V] reference."""
  rows = jnp.take(values, slots, axis=0)
  return jnp.einsum("...j,...jv->...v", weights, rows.astype(weights.dtype))
