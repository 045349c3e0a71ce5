"""Per-slot sums of a product-key memory's reads and the usage metrics of
Kim & Jung (2020, section 3.2): MU, top-1 MU, KL_u and KL_w."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

USAGE_COUNTS = ("token", "head")


def _token_slots(slots: Array, weights: Array) -> tuple[Array, Array, Array]:
  """Each token's distinct slots and their weights summed over heads.

  Args:
    slots: [N, H, k] slots read.
    weights: [N, H, k] their weights.

  Returns:
    (sorted slots [N, H*k], first [N, H*k] bool: the first entry of each
    distinct slot, top [N] the slot of largest summed weight, ties to the
    lower slot).
  """
  n = slots.shape[0]
  flat_s, flat_w = slots.reshape(n, -1), weights.reshape(n, -1)
  order = jnp.argsort(flat_s, axis=-1)
  s = jnp.take_along_axis(flat_s, order, -1)
  w = jnp.take_along_axis(flat_w, order, -1)
  first = jnp.concatenate(
      [jnp.ones((n, 1), bool), s[:, 1:] != s[:, :-1]], axis=-1
  )
  seg = jnp.cumsum(first, axis=-1) - 1  # [N, H*k] run of each entry
  m = s.shape[1]
  totals = jax.vmap(lambda x, i: jax.ops.segment_sum(x, i, m))(w, seg)
  runs = jnp.arange(m)[None, :] <= seg[:, -1:]  # segments that hold a slot
  totals = jnp.where(runs, totals, -1.0)
  seg_slot = jax.vmap(lambda x, i: jax.ops.segment_max(x, i, m))(s, seg)
  top = jnp.take_along_axis(seg_slot, jnp.argmax(totals, axis=-1)[:, None], -1)[
      :, 0
  ]
  return s, first, top


def usage_counts(
    slots: Array,
    weights: Array,
    valid: Array,
    num_slots: int,
    per: str = "token",
) -> tuple[Array, Array, Array]:
  """Per-slot sums of one call's reads (Kim & Jung, section 3.2).

  Kim & Jung's t'_i = sum_x delta(argmax_j w(x)_j = i) counts one top-1 per
  token x, w(x) its weights over the slots: here each head's softmax
  weights summed per slot. u'_i = sum_x delta(w(x)_i > 0) likewise counts
  a token once per slot however many heads read it. ``per='head'`` counts
  every head's read and top-1 instead (H top-1 events per token).

  Args:
    slots: [N, H, k] slots read (top-1 first).
    weights: [N, H, k] their softmax weights.
    valid: [N] 1 for positions that count, 0 for padding.
    num_slots: |K|.
    per: 'token' or 'head' (``USAGE_COUNTS``).

  Returns:
    (u' reads [|K|], t' top-1 reads [|K|], w' summed weights [|K|]), all
    float32.
  """
  v = valid.astype(jnp.float32)
  zeros = jnp.zeros((num_slots,), jnp.float32)
  wsum = zeros.at[slots.reshape(-1)].add(
      (weights * v[:, None, None]).reshape(-1)
  )
  if per == "head":
    reads = zeros.at[slots.reshape(-1)].add(
        jnp.broadcast_to(v[:, None, None], slots.shape).reshape(-1)
    )
    top1 = zeros.at[slots[..., 0].reshape(-1)].add(
        jnp.broadcast_to(v[:, None], slots.shape[:2]).reshape(-1)
    )
    return reads, top1, wsum
  if per != "token":
    raise ValueError(f"per must be one of {USAGE_COUNTS}, got {per!r}")
  s, first, top = _token_slots(slots, weights)
  reads = zeros.at[s.reshape(-1)].add((first * v[:, None]).reshape(-1))
  top1 = zeros.at[top].add(v)
  return reads, top1, wsum


def _kl_uniform(counts: Array) -> Array:
  """log|K| + sum_i p_i log p_i of p = counts / sum (0 log 0 = 0)."""
  p = counts / jnp.maximum(jnp.sum(counts), 1e-30)
  plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)
  return jnp.log(float(counts.shape[0])) + jnp.sum(plogp)


def usage_metrics(reads: Array, top1: Array, wsum: Array) -> dict[str, Array]:
  """MU, top-1 MU, KL_u, KL_w of per-slot sums [|K|] (section 3.2)."""
  return {
      "mu": jnp.mean((reads > 0).astype(jnp.float32)),
      "top1_mu": jnp.mean((top1 > 0).astype(jnp.float32)),
      "kl_u": _kl_uniform(reads),
      "kl_w": _kl_uniform(wsum),
  }
