"""A rolling key/value cache for a sliding-window attention layer.

A layer whose queries read only the last W positions (``sliding_window``:
Mistral, Gemma 3's local layers, Qwen2's windowed layers) keeps W slots,
not one per position of the text: position s's keys and values sit at
slot s mod W, beside ``slots`` [B, W], the position each slot holds (-1:
none). A call with Q new rows at positions pos .. pos + Q - 1 (one
decoding step, a prefill, or a window run again) attends over the W kept
rows that come before pos and its own Q rows, masked by their positions
(causal, within the window, and the decoder's mask of the full-length
text gathered at them), then keeps the last min(Q, W) of its rows. Rows
kept from positions at or after pos (a window run again rewrites them)
are masked out.

The cache is the tuple (keys [B, W, H_kv, d_h], values, slots [B, W]
int32); a plain layer's is (keys, values) with a slot per position.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

Array = jax.Array


def init(
    batch: int, window: int, heads: int, head_dim: int, dtype
) -> tuple[Array, Array, Array]:
  """An empty rolling cache of ``window`` slots."""
  zeros = jnp.zeros((batch, window, heads, head_dim), dtype)
  return zeros, zeros, jnp.full((batch, window), -1, jnp.int32)


def is_rolling(cache: Optional[tuple]) -> bool:
  """Whether a layer's cache is rolling (it holds its slots' positions)."""
  return cache is not None and len(cache) == 3


def extend(
    cache: tuple[Array, Array, Array],
    k: Array,
    v: Array,
    pos: Array,
    mask: Optional[Array],
    window: int,
) -> tuple[Array, Array, Array, tuple[Array, Array, Array]]:
  """The keys a call reads and the cache after it.

  Args:
    cache: (keys [B, W, H_kv, d_h], values, slots [B, W] int32).
    k, v: [B, Q, H_kv, d_h] the call's rows, at positions pos .. pos + Q - 1.
    pos: scalar int32.
    mask: the decoder's bool [B, 1, Q or 1, L] over the text's positions
      (True = may read), or None.
    window: W, the layer's sliding window.

  Returns:
    (keys and values [B, W + Q, H_kv, d_h], keep [B, 1, Q, W + Q] bool:
    causal, within the window and ``mask``; the new cache).
  """
  keys, values, slots = cache
  b, q = k.shape[:2]
  new = pos + jnp.arange(q, dtype=jnp.int32)
  old = jnp.where((slots >= 0) & (slots < pos), slots, -1)
  at = jnp.concatenate([old, jnp.broadcast_to(new, (b, q))], axis=1)
  rows = new[None, None, :, None]  # The queries' positions.
  keys_at = at[:, None, None, :]
  keep = (keys_at >= 0) & (keys_at <= rows) & (keys_at > rows - window)
  if mask is not None:
    index = jnp.broadcast_to(
        jnp.maximum(keys_at, 0), mask.shape[:-1] + (at.shape[1],)
    )
    keep = keep & jnp.take_along_axis(mask, index, axis=-1)
  read_k = jnp.concatenate([keys, k.astype(keys.dtype)], axis=1)
  read_v = jnp.concatenate([values, v.astype(values.dtype)], axis=1)
  m = min(q, keys.shape[1])  # The last m rows are kept.
  put = new[q - m :] % keys.shape[1]
  cache = (
      keys.at[:, put].set(k[:, q - m :].astype(keys.dtype)),
      values.at[:, put].set(v[:, q - m :].astype(values.dtype)),
      slots.at[:, put].set(jnp.broadcast_to(new[q - m :], (b, m))),
  )
  return read_k, read_v, keep, cache
