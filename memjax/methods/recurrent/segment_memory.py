"""The memories of Transformer-XL and LaMemo: pytree types and updates.

The memories are explicit pytrees that a layer takes in and returns; nothing
lives in a mutable Flax collection. Every memory has a ``valid: [B, M]
bool`` mask: a slot that is not valid is masked out of every attention that
could read it, so a lane whose ``valid`` is all False behaves exactly like a
lane with no memory. Memory contents are always stop-gradient. The generic
helpers (resetting lanes, FIFO appends, scanning segments) are in
``memjax.models.recurrence``.

Types:

* ``XLMemory``: the last M vectors of a stream, ``x: [B, M, D]``. Used for a
  Transformer-XL layer (the normed layer inputs, compute dtype) and for the
  layer-0 inputs that a LaMemo stack carries (see docs/lamemo.md).
* ``LaMemoMemory``: one LaMemo layer's attention outputs (before the output
  projection) ``c: [B, M, H, dh]`` and their log-normalisers
  ``lse: [B, M, H]``, both float32.
* ``LaMemoCache``: one LaMemo layer's key/value cache in decoding
  (``lamemo_decoding``): the current segment's rows and the memory it
  entered with.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from memjax.models import recurrence


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


@flax.struct.dataclass
class LaMemoCache:
  """One LaMemo layer's cache while decoding a segment of T (the memory
  rows at slots 0 .. M - 1, segment token i at slot M + i).

  Attributes:
      k, v: [B, M + T, H, dh] keys and values of the memory rows (their
          states refreshed at the segment's start) and of the segment's
          tokens so far.
      c: [B, M + T, H, dh] float32 the rows' attention outputs: the
          refreshed memory vectors, then the tokens' causal ones.
      lse: [B, M + T, H] float32 their log-normalisers.
      valid: [B, M + T] bool, the rows that hold something.
      old: the ``LaMemoMemory`` the segment started with (M slots).
  """

  k: jax.Array
  v: jax.Array
  c: jax.Array
  lse: jax.Array
  valid: jax.Array
  old: LaMemoMemory


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
      x=recurrence.fifo_append(memory.x, x, mem_len),
      valid=recurrence.fifo_append(
          memory.valid, jnp.ones((batch, seg_len), jnp.bool_), mem_len
      ),
  )
  return jax.lax.stop_gradient(new)
