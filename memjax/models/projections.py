"""The attention core's projections, in the two layouts runs have saved
(``multihead``): the initialisers of the 'param' layout (Glorot-uniform
[D, H, d_h] and [H, d_h, D] parameters) and the sub-layers of the 'module'
layout (a LeCun-normal ``kernel`` each)."""

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


class HeadProjection(nn.Module):
  """Bias-free projection to heads: [..., D] -> [..., H, dh] ('module'
  layout). Parameter: kernel [D, H, dh] ('embed', 'heads', 'kv')."""

  num_heads: int
  head_dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = self.param(
        "kernel",
        nn.with_logical_partitioning(
            nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2)),
            ("embed", "heads", "kv"),
        ),
        (x.shape[-1], self.num_heads, self.head_dim),
        self.param_dtype,
    )
    return jnp.einsum(
        "...d,dhk->...hk", x.astype(self.dtype), kernel.astype(self.dtype)
    )


class OutputProjection(nn.Module):
  """Bias-free projection from heads: [..., H, dh] -> [..., D] ('module'
  layout). Parameter: kernel [H, dh, D] ('heads', 'kv', 'embed')."""

  d_model: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = self.param(
        "kernel",
        nn.with_logical_partitioning(
            nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2),
            ("heads", "kv", "embed"),
        ),
        x.shape[-2:] + (self.d_model,),
        self.param_dtype,
    )
    return jnp.einsum(
        "...hk,hkd->...d", x.astype(self.dtype), kernel.astype(self.dtype)
    )
