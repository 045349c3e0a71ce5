"""Segment-recurrent memory: pytree types, FIFO updates and scanning.

The memories of Transformer-XL and LaMemo are explicit pytrees that a layer
takes in and returns; nothing lives in a mutable Flax collection. Every memory
has a ``valid: [B, M] bool`` mask: a slot that is not valid is masked out of
every attention that could read it, so a lane whose ``valid`` is all False
behaves exactly like a lane with no memory. Memory contents are always
stop-gradient.

Types:

* ``XLMemory``: the last M vectors of a stream, ``x: [B, M, D]``. Used for a
  Transformer-XL layer (the normed layer inputs, compute dtype) and for the
  layer-0 inputs that a LaMemo stack carries (see docs/lamemo.md).
* ``LaMemoMemory``: one LaMemo layer's attention outputs (before the output
  projection) ``c: [B, M, H, dh]`` and their log-normalisers
  ``lse: [B, M, H]``, both float32.

Helpers: ``init_xl_memory``, ``init_lamemo_memory``, ``reset_memory``,
``push_xl_memory``, ``fifo_append``, ``split_segments``, ``merge_segments`` and
``scan_segments``.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import flax
import jax
import jax.numpy as jnp

Carry = TypeVar("Carry")
PyTree = Any


@flax.struct.dataclass
class XLMemory:
  """The last M vectors of a stream.

  Attributes:
      x: [B, M, D] vectors, oldest first. For an ``XLAttention`` layer these
          are the normed layer inputs in the compute dtype.
      valid: [B, M] bool; False marks an empty slot (start of a stream or a
          reset lane). Invalid slots hold zeros.
  """

  x: jax.Array
  valid: jax.Array


@flax.struct.dataclass
class LaMemoMemory:
  """One LaMemo layer's memory.

  Attributes:
      c: [B, M, H, dh] float32 attention output vectors of the memory
          tokens (before the output projection), refreshed by look-ahead
          attention and interpolation every segment.
      lse: [B, M, H] float32 log-normalisers of ``c``: logsumexp of the
          scaled, masked attention scores that ``c`` averages over
          (accumulated with logaddexp across refreshes).
      valid: [B, M] bool; False marks an empty slot. Invalid slots hold zeros.
  """

  c: jax.Array
  lse: jax.Array
  valid: jax.Array


def init_xl_memory(
    batch_size: int, mem_len: int, d_model: int, dtype: Any = jnp.float32
) -> XLMemory:
  """An empty (all invalid, zero) ``XLMemory``.

  Args:
      batch_size: B.
      mem_len: M.
      d_model: D.
      dtype: dtype of ``x`` (the attention's compute dtype).

  Returns:
      ``XLMemory`` with ``x: [B, M, D] dtype`` zeros and ``valid`` all False.
  """
  return XLMemory(
      x=jnp.zeros((batch_size, mem_len, d_model), dtype),
      valid=jnp.zeros((batch_size, mem_len), jnp.bool_),
  )


def init_lamemo_memory(
    batch_size: int, mem_len: int, num_heads: int, head_dim: int
) -> LaMemoMemory:
  """An empty (all invalid, zero) ``LaMemoMemory``.

  Args:
      batch_size: B.
      mem_len: M.
      num_heads: H.
      head_dim: dh.

  Returns:
      ``LaMemoMemory`` with float32 zeros ``c: [B, M, H, dh]``,
      ``lse: [B, M, H]`` and ``valid: [B, M]`` all False.
  """
  return LaMemoMemory(
      c=jnp.zeros((batch_size, mem_len, num_heads, head_dim), jnp.float32),
      lse=jnp.zeros((batch_size, mem_len, num_heads), jnp.float32),
      valid=jnp.zeros((batch_size, mem_len), jnp.bool_),
  )


def reset_memory(memory: PyTree, reset: jax.Array) -> PyTree:
  """Empties the memory of the lanes where ``reset`` is True.

  Works on any pytree of memories (one layer's memory or a whole stack's)
  whose leaves all have the batch as their leading axis: boolean leaves (the
  ``valid`` masks) become False and every other leaf becomes zero on the
  reset lanes. Other lanes are returned unchanged. A reset lane is then
  indistinguishable from a lane made by ``init_*_memory``.

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


def push_xl_memory(memory: XLMemory, x: jax.Array, mem_len: int) -> XLMemory:
  """Appends a segment to an ``XLMemory`` and keeps the last ``mem_len``.

  Args:
      memory: ``XLMemory`` with ``x: [B, M, D]``.
      x: [B, T, D] the new segment's vectors (cast to ``memory.x.dtype``).
      mem_len: slots in the returned memory.

  Returns:
      Stop-gradient ``XLMemory`` with ``x: [B, mem_len, D]``.
  """
  batch, seg_len = x.shape[:2]
  new = XLMemory(
      x=fifo_append(memory.x, x, mem_len),
      valid=fifo_append(
          memory.valid, jnp.ones((batch, seg_len), jnp.bool_), mem_len
      ),
  )
  return jax.lax.stop_gradient(new)


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
