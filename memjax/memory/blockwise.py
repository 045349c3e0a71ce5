"""Masked log-sum-exp of query-key similarities, dense or blockwise.

For every query i this computes, over the keys j it may see,

    lse_all[i] = log sum_{j visible}                 exp(scale * q_i . k_j)
    lse_pos[i] = log sum_{j visible, tok_j = tgt_i}  exp(scale * q_i . k_j)

which is all that the TRIME loss (Eq. 5 of Zhong et al. 2022) and the
continuous cache (Grave et al. 2017) need from a memory. An empty sum gives
exactly -inf, and neither the value nor the gradient is ever NaN.

Why this is written here rather than taken from a library: the quantity is
attention's softmax normaliser with a second, label-dependent mask, and no
well-kept JAX library exposes a blockwise masked log-sum-exp with an online
update and a custom visibility predicate (jax.nn.dot_product_attention and
the Pallas flash kernels return the attention output, not the normaliser,
and take dense or causal masks only).

Blockwise scheme. Keys are cut into contiguous blocks of `bk` and queries
into `nq` strided blocks of `bq` (block b holds queries b, b + nq, ...,
so that when queries are sharded over a data axis each block keeps the
sharding). An outer `lax.scan` walks the query blocks, an inner one the key
blocks with an online log-sum-exp (running max and rescaled sum). Both scan
bodies are wrapped in `jax.checkpoint`, so the backward pass recomputes each
[bq, bk] tile instead of storing it: peak memory is O(N * D + nk * bq +
bq * bk), linear in the number of memories N, instead of the dense path's
O(N^2).

Masking without NaN ("where trick"): masked scores are replaced by a finite
value before the exponential and the exponential is zeroed afterwards, the
running max is a stop-gradient constant (the log-sum-exp does not depend on
it), and the final log of an empty sum is selected away with `where` on both
the value and its argument, so masked entries get exactly zero gradient.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from memjax.models import stack

Array = jax.Array
VisibleFn = Callable[[Any, Any], Array]
BlockSize = int | Sequence[int] | None

_NEG_INF = float("-inf")


def _block_sizes(
    block_size: BlockSize, num_q: int, num_k: int
) -> tuple[int, int]:
  """Returns (bq, bk), clipped to the problem size."""
  if isinstance(block_size, int):
    bq = bk = block_size
  else:
    bq, bk = block_size
  if bq <= 0 or bk <= 0:
    raise ValueError(f"block sizes must be positive; got {block_size}.")
  return max(1, min(bq, num_q)), max(1, min(bk, num_k))


def _pad_to(x: Array, size: int, value: Any = 0) -> Array:
  """Pads the leading axis of x to `size` with `value`."""
  pad = size - x.shape[0]
  if pad == 0:
    return x
  widths = [(0, pad)] + [(0, 0)] * (x.ndim - 1)
  return jnp.pad(x, widths, constant_values=value)


def _online_update(
    m: Array, l: Array, s: Array, mask: Array
) -> tuple[Array, Array]:
  """One step of a masked online log-sum-exp.

  Args:
      m: [Q] f32 running max (stop-gradient), -inf where nothing seen yet.
      l: [Q] f32 running sum of exp(s - m) over the visible entries so far.
      s: [Q, K] f32 scores of this block.
      mask: [Q, K] bool, which scores count.

  Returns:
      The updated (m, l).
  """
  block_max = jnp.max(jnp.where(mask, s, _NEG_INF), axis=-1)
  m_new = lax.stop_gradient(jnp.maximum(m, block_max))
  m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
  # m <= m_safe wherever m is finite, and exp(-inf) = 0 otherwise.
  alpha = jnp.exp(m - m_safe)
  shifted = jnp.where(mask, s, m_safe[:, None]) - m_safe[:, None]
  p = jnp.where(mask, jnp.exp(shifted), 0.0)
  return m_new, l * alpha + jnp.sum(p, axis=-1)


def _finalize(m: Array, l: Array) -> Array:
  """log-sum-exp from the online state: -inf (zero gradient) where empty."""
  nonempty = l > 0
  m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
  return jnp.where(
      nonempty, m_safe + jnp.log(jnp.where(nonempty, l, 1.0)), _NEG_INF
  )


def _tile(
    q: Array,
    q_tgt: Array,
    q_meta: Any,
    k: Array,
    k_tok: Array,
    k_valid: Array,
    k_meta: Any,
    visible_fn: VisibleFn | None,
    scale: Array,
    precision: Any,
) -> tuple[Array, Array, Array]:
  """Scores and masks of one [bq, bk] tile (similarities in float32)."""
  s = (
      jnp.dot(
          q.astype(jnp.float32),
          k.astype(jnp.float32).T,
          precision=precision,
          preferred_element_type=jnp.float32,
      )
      * scale
  )
  vis = jnp.broadcast_to(k_valid[None, :], s.shape)
  if visible_fn is not None:
    vis = vis & visible_fn(q_meta, k_meta)
  pos = vis & (q_tgt[:, None] == k_tok[None, :])
  return s, vis, pos


class KeyBank(NamedTuple):
  """A memory's entries, as the memories built on ``memory_logsumexp``
  take them (TRIME's long-term memory bank, the continuous cache).

  Attributes:
    keys: [K, D] float, the entries' features.
    tokens: [K] int32, the token that followed each entry.
    valid: [K] bool, false for empty slots.
    positions: optional [K] int32 stream positions: with a query's
      position, entry j is visible to query i only if
      positions[j] < query_positions[i] (a window passed with the bank
      stays causal).
  """

  keys: Array
  tokens: Array
  valid: Array
  positions: Optional[Array] = None


def bank_logsumexp(
    queries: Array,
    targets: Array,
    bank: KeyBank,
    *,
    scale: float | Array,
    query_positions: Optional[Array] = None,
    block_size: BlockSize = 1024,
    precision: Any = None,
) -> tuple[Array, Array]:
  """``memory_logsumexp`` of queries [Q, D] with targets [Q] over a
  ``KeyBank``, causal by stream position when both sides give one.

  Raises:
    ValueError: positions on one side only.
  """
  if (query_positions is None) != (bank.positions is None):
    raise ValueError("Pass both query_positions and key_positions, or neither.")
  visible_fn = None
  if query_positions is not None:
    visible_fn = lambda qp, kp: kp[None, :] < qp[:, None]  # noqa: E731
  return memory_logsumexp(
      queries,
      bank.keys,
      targets,
      bank.tokens,
      bank.valid,
      scale=scale,
      query_meta=query_positions,
      key_meta=bank.positions,
      visible_fn=visible_fn,
      block_size=block_size,
      precision=precision,
  )


def memory_logsumexp(
    queries: Array,
    keys: Array,
    query_targets: Array,
    key_tokens: Array,
    key_valid: Array,
    *,
    scale: float | Array,
    query_meta: Any = None,
    key_meta: Any = None,
    visible_fn: VisibleFn | None = None,
    block_size: BlockSize = 1024,
    precision: Any = None,
) -> tuple[Array, Array]:
  """Masked log-sum-exp of scaled similarities over all and positive keys.

  Args:
      queries: [Q, D] float (any float dtype; similarities are computed in
          float32).
      keys: [K, D] float.
      query_targets: [Q] int, the token each query must predict.
      key_tokens: [K] int, the token stored with each key (a key is a
          positive for a query iff its token equals the query's target).
      key_valid: [K] bool, false for keys that are not memory entries
          (padding).
      scale: scalar multiplying q . k (e.g. 1 / (sqrt(D) * temperature)).
      query_meta: pytree of [Q] arrays passed (block-sliced) to visible_fn.
      key_meta: pytree of [K] arrays passed (block-sliced) to visible_fn.
      visible_fn: (query_meta_block, key_meta_block) -> [bq, bk] bool; None
          means every valid key is visible to every query.
      block_size: None for the dense reference path (materialises [Q, K]);
          an int or a (query_block, key_block) pair for the blockwise path.
      precision: passed to the similarity matmul (e.g.
          jax.lax.Precision.HIGHEST for full float32 on TPU/GPU).

  Returns:
      (lse_all, lse_pos), each [Q] float32, -inf where the sum is empty.
  """
  num_q, num_k = queries.shape[0], keys.shape[0]
  scale = jnp.asarray(scale, jnp.float32)
  query_targets = query_targets.astype(jnp.int32)
  key_tokens = key_tokens.astype(jnp.int32)
  key_valid = key_valid.astype(jnp.bool_)

  if num_k == 0:
    empty = jnp.full((num_q,), _NEG_INF, jnp.float32)
    return empty, empty

  if block_size is None:
    s, vis, pos = _tile(
        queries,
        query_targets,
        query_meta,
        keys,
        key_tokens,
        key_valid,
        key_meta,
        visible_fn,
        scale,
        precision,
    )
    init_m = jnp.full((num_q,), _NEG_INF, jnp.float32)
    init_l = jnp.zeros((num_q,), jnp.float32)
    lse_all = _finalize(*_online_update(init_m, init_l, s, vis))
    lse_pos = _finalize(*_online_update(init_m, init_l, s, pos))
    return lse_all, lse_pos

  return _blockwise_logsumexp(
      (queries, query_targets, query_meta),
      (keys, key_tokens, key_valid, key_meta),
      visible_fn,
      scale,
      precision,
      block_size,
  )


def _blockwise_logsumexp(
    query_parts: tuple[Array, Array, Any],
    key_parts: tuple[Array, Array, Array, Any],
    visible_fn: VisibleFn | None,
    scale: Array,
    precision: Any,
    block_size: BlockSize,
) -> tuple[Array, Array]:
  """The blockwise path of ``memory_logsumexp``: [Q] (lse_all, lse_pos).

  Queries go in strided blocks of bq and keys in contiguous blocks of bk;
  an online log-sum-exp runs over the key blocks of each query block, each
  under ``jax.checkpoint`` so the backward pass keeps no [bq, bk] tile.
  """
  queries, query_targets, query_meta = query_parts
  keys, key_tokens, key_valid, key_meta = key_parts
  num_q, num_k = queries.shape[0], keys.shape[0]
  bq, bk = _block_sizes(block_size, num_q, num_k)
  nq = -(-num_q // bq)
  nk = -(-num_k // bk)
  ku, qu = stack.unroll_factor(nk), stack.unroll_factor(nq)

  # Queries: pad to nq * bq, then strided blocks [nq, bq, ...].
  def to_q_blocks(x):
    x = _pad_to(x, nq * bq)
    x = x.reshape((bq, nq) + x.shape[1:])
    return jnp.moveaxis(x, 1, 0)

  # Keys: pad (invalid) to nk * bk, then contiguous blocks [nk, bk, ...].
  def to_k_blocks(x, value=0):
    x = _pad_to(x, nk * bk, value)
    return x.reshape((nk, bk) + x.shape[1:])

  q_blocks = (
      to_q_blocks(queries),
      to_q_blocks(query_targets),
      jax.tree_util.tree_map(to_q_blocks, query_meta),
  )
  k_blocks = (
      to_k_blocks(keys),
      to_k_blocks(key_tokens),
      to_k_blocks(key_valid, False),
      jax.tree_util.tree_map(to_k_blocks, key_meta),
  )

  def key_step(carry, k_blk, q_blk):
    m_all, l_all, m_pos, l_pos = carry
    q, q_tgt, q_meta = q_blk
    k, k_tok, k_val, k_meta = k_blk
    s, vis, pos = _tile(
        q, q_tgt, q_meta, k, k_tok, k_val, k_meta, visible_fn, scale, precision
    )
    m_all, l_all = _online_update(m_all, l_all, s, vis)
    m_pos, l_pos = _online_update(m_pos, l_pos, s, pos)
    return (m_all, l_all, m_pos, l_pos)

  @functools.partial(jax.checkpoint, prevent_cse=False)
  def query_block(q_blk, k_blks):
    @functools.partial(jax.checkpoint, prevent_cse=False)
    def body(carry, k_blk):
      return key_step(carry, k_blk, q_blk), None

    init = (
        jnp.full((bq,), _NEG_INF, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
        jnp.full((bq,), _NEG_INF, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    (m_all, l_all, m_pos, l_pos), _ = lax.scan(body, init, k_blks, unroll=ku)
    return _finalize(m_all, l_all), _finalize(m_pos, l_pos)

  def outer(carry, q_blk):
    return carry, query_block(q_blk, k_blocks)

  _, (lse_all, lse_pos) = lax.scan(outer, None, q_blocks, unroll=qu)

  def from_q_blocks(x):  # [nq, bq] -> [Q]
    return jnp.moveaxis(x, 0, 1).reshape(nq * bq)[:num_q]

  return from_q_blocks(lse_all), from_q_blocks(lse_pos)


def softplus(x: Array) -> Array:
  """log(1 + exp(x)), exactly 0 with zero gradient at x = -inf.

  jax.nn.softplus goes through jnp.logaddexp, whose derivative rule replaces
  infinities by 0 and so reports slope 1 at -inf; here both branches of the
  `where` get finite arguments.
  """
  big = x > 0
  x_pos = jnp.where(big, x, 0.0)
  x_neg = jnp.where(big, 0.0, x)
  return jnp.where(
      big, x_pos + jnp.log1p(jnp.exp(-x_pos)), jnp.log1p(jnp.exp(x_neg))
  )


def logaddexp(a: Array, b: Array) -> Array:
  """log(exp(a) + exp(b)), NaN-free in value and gradient when either is -inf.

  Args:
      a: float array.
      b: float array of the same shape.

  Returns:
      Elementwise log(exp(a) + exp(b)); exactly a where b is -inf (and vice
      versa), -inf where both are, with zero gradient into -inf arguments.
  """
  hi = jnp.maximum(a, b)
  lo = jnp.minimum(a, b)
  finite = jnp.isfinite(hi)
  hi_safe = jnp.where(finite, hi, 0.0)
  lo_safe = jnp.where(finite, lo, 0.0)
  return jnp.where(
      finite, hi_safe + softplus(lo_safe - hi_safe), jax.lax.stop_gradient(hi)
  )


def masked_logsumexp(x: Array, mask: Array) -> Array:
  """log sum_{mask} exp(x) over the last axis; -inf where nothing is
  masked in. The gradient is NaN-free: masked-out entries are replaced
  before the exp, and the shift is a constant.

  Args:
    x: [..., K] float.
    mask: bool broadcastable to ``x``.

  Returns:
    [...] float.
  """
  m = jnp.max(jnp.where(mask, x, -jnp.inf), axis=-1, keepdims=True)
  m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
  total = jnp.sum(jnp.where(mask, jnp.exp(jnp.where(mask, x, m) - m), 0.0), -1)
  ok = total > 0
  return jnp.where(ok, m[..., 0] + jnp.log(jnp.where(ok, total, 1.0)), -jnp.inf)
