"""The attention core's relative positions (``multihead``'s ``relative``):
Transformer-XL's position terms in its 'xl' scheme and LaMemo's
'disentangled' one, the sinusoid encodings of distances and the relative
shift they use, the 'module' parameter layout the relative kinds saved
their runs in (a LeCun-normal ``kernel`` per projection), and their masked
softmax with its log-normaliser (LaMemo interpolates with it), whose
probabilities a bfloat16 step keeps in bfloat16 (``narrow_softmax``)."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

# Masked scores get this value: exp(NEG_INF - anything finite) is exactly 0
# in float32, and a fully masked row stays finite (never NaN).
NEG_INF: float = -1e30


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


def relative_scores(
    core: Any, q: Array, k: Array, delta_top: int, past_only: bool
) -> Array:
  """Transformer-XL's position terms (Dai et al. Eq. 6; LaMemo Eq. 12):
  ``q_i . r_ij + b_ij . r_ij``, unscaled (``core.scores`` adds u . k_j).

  Queries and keys are consecutive runs of positions; query i and key j
  are ``delta_top - (Q - 1 - i) - j`` positions apart.

  Args:
    core: the attention core (``multihead.MultiHeadAttention``) whose
      ``pos_key`` and position biases (v, or v_plus and v_minus) are read.
    q: [B, Q, H, dh] queries.
    k: [B, K, H, dh] content keys.
    delta_top: distance (query minus key position) of the last query and
      the first key (a traced scalar: at most K - 1, past keys only).
    past_only: whether only keys at or before the query (distance >= 0)
      will be read; then fewer distances are encoded and the other
      entries of the result are junk (to be masked).

  Returns:
    [B, H, Q, K] float32.
  """
  q_len, k_len = q.shape[1], k.shape[1]
  if not past_only:
    num_cols = k_len + q_len - 1
  elif isinstance(delta_top, int):
    num_cols = max(k_len, delta_top + 1)
  else:  # A decoding step's position (traced): at most the last key's.
    num_cols = k_len
  deltas = delta_top - jnp.arange(num_cols, dtype=jnp.int32)
  shape = (num_cols, core.num_heads, core.head_dim)
  f32 = jnp.float32
  if core.relative == "xl":
    positions = deltas
    bias = jnp.broadcast_to(jnp.asarray(core.v, f32), shape)
  else:
    positions = jnp.abs(deltas)
    bias = jnp.where(
        (deltas >= 0)[:, None, None],
        jnp.asarray(core.v_plus, f32),
        jnp.asarray(core.v_minus, f32),
    )
  enc = sinusoid_positions(positions.astype(f32), core.d_model)
  r = core.pos_key(enc.astype(core.dtype))
  position = jnp.einsum("bqhd,phd->bhqp", q, r, preferred_element_type=f32)
  position += jnp.einsum("phd,phd->hp", bias, r.astype(f32))[None, :, None]
  return rel_shift(position)[..., :k_len]


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


def masked_softmax(scores: Array, mask: Array) -> tuple[Array, Array]:
  """Softmax over the last axis with a mask, and its log-normaliser.

  Args:
    scores: [..., K] float32 scaled scores.
    mask: bool, broadcastable to ``scores``; False entries are excluded.

  Returns:
    (probs [..., K] float32 with exact zeros where masked, and zeros in a
     row with no key at all; lse [...] float32 logsumexp of the unmasked
     scores).
  """
  scores = jnp.where(mask, scores, NEG_INF)
  lse = jax.nn.logsumexp(scores, axis=-1)
  probs = jnp.exp(scores - lse[..., None])
  any_key = jnp.broadcast_to(mask, scores.shape).any(axis=-1, keepdims=True)
  return jnp.where(any_key, probs, 0.0), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def narrow_softmax(
    scores: Array, mask: Array, dtype: Any
) -> tuple[Array, Array]:
  """``masked_softmax`` computed in float32 whose probabilities are returned
  and kept for the backward pass in ``dtype`` (bfloat16: half the bytes of
  the attention residuals); the gradient is computed in float32.

  Returns:
    (probs [..., K] in ``dtype``, lse [...] float32).
  """
  probs, lse = masked_softmax(scores, mask)
  return probs.astype(dtype), lse


def _narrow_fwd(scores, mask, dtype):
  probs, lse = narrow_softmax(scores, mask, dtype)
  return (probs, lse), (probs, mask)


def _narrow_bwd(dtype, saved, grads):
  del dtype
  probs, mask = saved
  g_probs, g_lse = grads
  y = probs.astype(jnp.float32)
  g = g_probs.astype(jnp.float32)
  # d probs_k / d s_j = y_k (delta_kj - y_j); d lse / d s_j = y_j.
  d = y * (g - jnp.sum(g * y, axis=-1, keepdims=True) + g_lse[..., None])
  return jnp.where(mask, d, 0.0), None


narrow_softmax.defvjp(_narrow_fwd, _narrow_bwd)
