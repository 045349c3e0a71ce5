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


def qkv_init() -> nn.initializers.Initializer:
  """Glorot-uniform for a [D, H, d_h] input projection."""
  return nn.initializers.variance_scaling(
      1.0, "fan_avg", "uniform", in_axis=0, out_axis=(1, 2)
  )


def out_init() -> nn.initializers.Initializer:
  """Glorot-uniform for a [H, d_h, D] output projection."""
  return nn.initializers.variance_scaling(
      1.0, "fan_avg", "uniform", in_axis=(0, 1), out_axis=2
  )


def head_projection(
    module: nn.Module, name: str, d_model: int, num_heads: int, head_dim: int
) -> jax.Array:
  """A [D, H, d_h] projection parameter named with logical axes.

  Declared directly rather than through nn.DenseGeneral, whose initialiser
  boxes a flattened 2-D kernel and so cannot carry 3-D axis names.
  """
  return module.param(
      name,
      nn.with_logical_partitioning(qkv_init(), ("embed", "heads", "kv")),
      (d_model, num_heads, head_dim),
  )


def output_projection(
    module: nn.Module, name: str, d_model: int, num_heads: int, head_dim: int
) -> jax.Array:
  """A [H, d_h, D] output projection parameter named with logical axes."""
  return module.param(
      name,
      nn.with_logical_partitioning(out_init(), ("heads", "kv", "embed")),
      (num_heads, head_dim, d_model),
  )


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
  def __call__(
      self, x: Array, memory: Any = None, *, deterministic: bool = True
  ) -> tuple[Array, None]:
    """Attends causally within the segment.

    Args:
      x: [B, T, D] pre-normalised layer input.
      memory: unused (no recurrence); must be None.
      deterministic: disables dropout.

    Returns:
      ([B, T, D] output after the output projection, None).
    """
    del memory
    dims = (self.d_model, self.num_heads, self.head_dim)
    x = x.astype(self.dtype)
    q, k, v = (
        jnp.einsum(
            "btd,dhk->bthk",
            x,
            head_projection(self, n, *dims).astype(self.dtype),
        )
        for n in ("query", "key", "value")
    )
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
    wo = output_projection(self, "out", *dims).astype(self.dtype)
    return jnp.einsum("bthk,hkd->btd", ctx, wo), None
