"""Causal multi-head self-attention with absolute positions (vanilla LM).

Relative-position and recurrent-memory attention live in ``relative.py`` and
``lamemo.py``; all share the call signature documented in ``transformer.py``:
``attn(x_normed, memory, deterministic=...) -> (y, new_memory)``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def dense_general(features, axes, name, dtype, in_axis=-1):
  """A DenseGeneral whose kernel carries logical axis names."""
  return nn.DenseGeneral(
      features=features, axis=in_axis, use_bias=False, dtype=dtype, name=name,
      kernel_init=nn.with_logical_partitioning(
          nn.initializers.xavier_uniform(), axes))


class CausalSelfAttention(nn.Module):
  """Multi-head causal self-attention over the current segment only.

  Attributes:
    d_model: D.
    num_heads: H.
    head_dim: d_h.
    dropout_rate: dropout on attention probabilities.
    dtype: compute dtype; softmax runs in float32.
  """

  d_model: int
  num_heads: int
  head_dim: int
  mem_len: int = 0
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, memory: Any = None, *,
               deterministic: bool = True) -> tuple[Array, None]:
    """Attends causally within the segment.

    Args:
      x: [B, T, D] pre-normalised layer input.
      memory: unused (no recurrence); must be None.
      deterministic: disables dropout.

    Returns:
      ([B, T, D] output after the output projection, None).
    """
    del memory
    hd = (self.num_heads, self.head_dim)
    q = dense_general(hd, ("embed", "heads", "kv"), "query", self.dtype)(x)
    k = dense_general(hd, ("embed", "heads", "kv"), "key", self.dtype)(x)
    v = dense_general(hd, ("embed", "heads", "kv"), "value", self.dtype)(x)
    q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
    k = nn.with_logical_constraint(k, ("batch", "length", "heads", "kv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
    scores = scores / jnp.sqrt(jnp.float32(self.head_dim))
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal[None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = nn.Dropout(self.dropout_rate)(probs, deterministic=deterministic)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(self.dtype), v)
    out = nn.DenseGeneral(
        features=self.d_model, axis=(-2, -1), use_bias=False, dtype=self.dtype,
        name="out",
        kernel_init=nn.with_logical_partitioning(
            nn.initializers.xavier_uniform(), ("heads", "kv", "embed")))(ctx)
    return out, None
