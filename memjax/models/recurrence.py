"""Recurrent state: resetting lanes, FIFO updates and scanning segments.

A model that carries memory across segments (``model.carries_memory()``)
takes an explicit pytree in and returns the next one; nothing lives in a
mutable Flax collection. Every leaf has the lane (batch) as its leading
axis, and boolean leaves are ``valid`` masks: a slot that is not valid is
read by no attention, so a lane whose masks are all False behaves exactly
like a lane with no memory. The memory types of the recurrent attention
kinds (Transformer-XL, LaMemo) are in ``memjax/methods/recurrent/segment_memory.py``.

Helpers: ``reset_memory``, ``fifo_append``, ``split_segments``,
``merge_segments`` and ``scan_segments``; ``run_lane_segments`` runs the
consecutive segments of each lane of a training batch in order (the train
step's forward pass for such a model).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import jax
import jax.numpy as jnp

from memjax.models import stack
from memjax.models import variables as model_vars

Carry = TypeVar("Carry")
PyTree = Any


def reset_memory(memory: PyTree, reset: jax.Array) -> PyTree:
  """Empties the memory of the lanes where ``reset`` is True.

  Works on any pytree of memories (one layer's memory or a whole stack's)
  whose leaves all have the batch as their leading axis: boolean leaves (the
  ``valid`` masks) become False and every other leaf becomes zero on the
  reset lanes. Other lanes are returned unchanged. A reset lane is then
  indistinguishable from a lane made by the attention kind's ``init_stack_memory``.

  Args:
      memory: pytree of arrays with leading axis B.
      reset: [B] bool.

  Returns:
      A pytree of the same structure, shapes and dtypes.
  """
  reset = jnp.asarray(reset, jnp.bool_)

  def _reset(leaf: jax.Array) -> jax.Array:
    mask = reset.reshape(reset.shape + (1,) * (leaf.ndim - 1))
    return jnp.where(mask, jnp.zeros((), leaf.dtype), leaf)

  return jax.tree_util.tree_map(_reset, memory)


def fifo_append(old: jax.Array, new: jax.Array, length: int) -> jax.Array:
  """The last ``length`` entries along axis 1 of ``concat(old, new)``.

  If the concatenation is shorter than ``length`` it is left-padded with
  zeros (False for booleans), so that the result always has ``length``
  entries on axis 1.

  Args:
      old: [B, M, ...].
      new: [B, T, ...], same trailing shape and dtype as ``old``.
      length: entries to keep.

  Returns:
      [B, length, ...].
  """
  both = jnp.concatenate([old, new.astype(old.dtype)], axis=1)
  total = both.shape[1]
  if total >= length:
    return both[:, total - length :]
  pad = [(0, 0)] * both.ndim
  pad[1] = (length - total, 0)
  return jnp.pad(both, pad)


def split_segments(stream: PyTree, segment_len: int) -> PyTree:
  """Cuts streams into consecutive segments stacked on a new leading axis.

  Args:
      stream: pytree of [B, S * segment_len, ...] arrays.
      segment_len: T.

  Returns:
      Pytree of [S, B, T, ...] arrays; segment s holds positions
      [s * T, (s + 1) * T).
  """

  def _split(a: jax.Array) -> jax.Array:
    batch, length = a.shape[:2]
    if length % segment_len:
      raise ValueError(
          f"stream length {length} is not a multiple of the segment "
          f"length {segment_len}"
      )
    a = a.reshape((batch, length // segment_len, segment_len) + a.shape[2:])
    return jnp.swapaxes(a, 0, 1)

  return jax.tree_util.tree_map(_split, stream)


def merge_segments(segments: PyTree) -> PyTree:
  """Inverse of ``split_segments``: [S, B, T, ...] -> [B, S * T, ...]."""

  def _merge(a: jax.Array) -> jax.Array:
    a = jnp.swapaxes(a, 0, 1)
    return a.reshape((a.shape[0], a.shape[1] * a.shape[2]) + a.shape[3:])

  return jax.tree_util.tree_map(_merge, segments)


def scan_segments(
    step_fn: Callable[[Carry, PyTree], tuple[Carry, PyTree]],
    carry: Carry,
    segments: PyTree,
    *,
    unroll: int = 1,
) -> tuple[Carry, PyTree]:
  """Runs ``step_fn`` over segments with ``jax.lax.scan``, carrying memory.

  ``step_fn(carry, segment) -> (carry, output)`` processes one segment; the
  carry (typically the memories of every layer, plus anything else the caller
  threads through, e.g. a PRNG key) must keep its structure, shapes and
  dtypes from step to step. Per-segment inputs that are not arrays of the
  stream (dropout keys, reset flags) can be stacked into ``segments`` too.

  Args:
      step_fn: the per-segment function.
      carry: initial carry.
      segments: pytree of arrays with the segments stacked on axis 0 (see
          ``split_segments``).
      unroll: passed to ``jax.lax.scan``.

  Returns:
      (final carry, outputs stacked on axis 0).
  """
  return jax.lax.scan(step_fn, carry, segments, unroll=unroll)


def run_lane_segments(
    model,
    params: Any,
    batch: dict[str, jax.Array],
    memory: Any,
    segments_per_lane: int,
    *,
    rng: jax.Array,
    deterministic: bool = False,
    model_state: Any = None,
) -> tuple[Any, dict[str, jax.Array], Any]:
  """Runs the m consecutive segments of every lane in order, carrying memory.

  A consecutive batch holds ``lanes * m`` rows, lane-major (lane 0's m
  segments, then lane 1's, ...). Segment k of every lane is run with the
  memory left by segment k - 1 (``jax.lax.scan`` over the m segments), and
  the outputs are stacked back into the batch's row order, so a loss sees
  each lane's whole stream with gradients into every segment's outputs.

  Args:
    model: a ``TransformerLM`` that carries memory.
    params: its parameters.
    batch: 'inputs', 'targets' [lanes * m, L] int32.
    memory: the memory of the lanes ([lanes, ...] leaves).
    segments_per_lane: m.
    rng: dropout key; segment k uses ``fold_in(rng, k)``.
    deterministic: disables dropout.
    model_state: {collection: tree} of the model's mutable collections
      (``memjax.run.step.make_train_step``), or None.

  Returns:
    (output, sums, model_state): the model's output
    (``memjax.models.transformer.LMOutput``) with [lanes * m, L(, D)]
    arrays in the batch's row order and the memory after each lane's last
    segment; the auxiliary statistics the modules report
    (``memjax.models.variables``) summed over the m segments, {path: [2]
    float32 (weighted sum, weight)}; the model state after the m segments,
    updated in their order.
  """
  m = segments_per_lane
  names = tuple(model_state or ())

  def to_segments(x):  # [lanes * m, ...] -> [m, lanes, ...]
    return jnp.swapaxes(x.reshape((-1, m) + x.shape[1:]), 0, 1)

  def to_rows(x):  # [m, lanes, ...] -> [lanes * m, ...]
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape((-1,) + x.shape[2:])

  def body(carry, xs):
    mem, ms = carry
    inputs, targets, k = xs
    out, sums, new_ms = model_vars.apply_with_state(
        model,
        model_vars.as_variables(params, ms),
        () if deterministic else names,
        inputs,
        targets,
        memory=mem,
        deterministic=deterministic,
        rngs={"dropout": jax.random.fold_in(rng, k)},
    )
    return (out.memory, new_ms or ms), (out.replace(memory=None), sums)

  (new_memory, new_state), (outs, sums) = jax.lax.scan(
      body,
      (memory, model_state),
      (
          to_segments(batch["inputs"]),
          to_segments(batch["targets"]),
          jnp.arange(m),
      ),
      unroll=stack.unroll_factor(m),
  )
  outs = jax.tree.map(to_rows, outs).replace(memory=new_memory)
  return outs, model_vars.total(sums), new_state
