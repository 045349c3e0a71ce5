"""Position encodings: the absolute sinusoid table (Vaswani et al.), the
sinusoid encodings of relative distances and Transformer-XL's relative
shift (the attention core's relative positions, ``multihead``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def sinusoid_table(length: int, dim: int) -> np.ndarray:
  """[length, dim] sinusoidal absolute position table (Vaswani et al.)."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  inv = 1.0 / (10000 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  ang = pos * inv[None]
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2] = np.sin(ang)
  table[:, 1::2] = np.cos(ang)[:, : dim // 2]
  return table


def sinusoid_positions(positions: Array, dim: int) -> Array:
  """Sinusoid encodings of (possibly negative) positions.

  Transformer-XL's layout: ``[sin(p * w_0), ..., sin(p * w_{dim/2-1}),
  cos(p * w_0), ..., cos(p * w_{dim/2-1})]`` with w_k = 10000^(-2k/dim).

  Args:
    positions: [P] float positions (relative distances here).
    dim: even encoding size.

  Returns:
    [P, dim] float32.
  """
  if dim % 2:
    raise ValueError(f"sinusoid dimension must be even, got {dim}")
  exponents = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
  inv_freq = 1.0 / (10000.0**exponents)
  angles = jnp.asarray(positions, jnp.float32)[:, None] * inv_freq[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def rel_shift(x: Array) -> Array:
  """Transformer-XL's relative shift (pad a zero column, reshape, drop a row).

  Turns scores computed per (query, relative-distance column) into scores
  per (query, key). With x of shape [..., Q, P]:

      y[..., i, j] = x[..., i, j + Q - 1 - i]   whenever j + Q - 1 - i < P,

  i.e. row i is shifted left by Q - 1 - i columns. Entries with
  j + Q - 1 - i >= P hold junk (the zero pad or the next row's values) and
  must be masked by the caller.

  Column c of x belongs to the relative distance delta_c = delta_top - c
  (query position minus key position, descending), where delta_top is the
  distance between the LAST query and the FIRST key. Then y[..., i, j]
  belongs to query i and key j. For causal attention with Q queries at the
  end of K keys, P = K and delta_top = K - 1, and the junk entries are
  exactly the future keys j > i + K - Q.

  Args:
    x: [..., Q, P].

  Returns:
    [..., Q, P], same dtype.
  """
  *lead, q_len, p_len = x.shape
  pad = [(0, 0)] * len(lead) + [(0, 0), (1, 0)]
  x = jnp.pad(x, pad)
  x = x.reshape(*lead, p_len + 1, q_len)
  x = x[..., 1:, :]
  return x.reshape(*lead, q_len, p_len)


def cached_causal_mask(
    length: int, cache_len: int, pos: Array, window: int = 0
) -> Array:
  """[1, 1, T, L] bool: the query at slot pos + i reads cache slots j <=
  pos + i, and with a ``window`` > 0 only j > pos + i - window."""
  q = pos + jnp.arange(length)[:, None]
  j = jnp.arange(cache_len)[None, :]
  keep = j <= q
  if window > 0:
    keep = keep & (j > q - window)
  return keep[None, None]
