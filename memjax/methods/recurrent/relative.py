"""Multi-head attention with relative positions (Transformer-XL, disentangled).

Both layers attend from the current segment over ``concat(memory, segment)``
and score a query at absolute position i against a key at position j with the
four terms of Transformer-XL (Dai et al. 2019; LaMemo paper Eq. 6):

    A[i, j] = q_i . k_j  +  q_i . r_ij  +  u . k_j  +  b_ij . r_ij,

where q_i = W_q x_i, k_j = W_kE x_j (content keys), r_ij = W_kR R(.) is a
projected sinusoid of the relative distance and u, b_ij are learned global
biases (per head). The two schemes differ in R and b:

* ``'xl'`` (Eq. 6): R = R_{i-j} (signed distance) and b_ij = v.
* ``'disentangled'`` (LaMemo Eq. 12): R = R_{|i-j|} and b_ij = v_plus if
  i >= j else v_minus, so distance and direction are separate.

For causal attention (every visible key has i >= j) the two schemes compute
the same function (v_plus playing v); they differ when a query looks to its
right (LaMemo's look-ahead, or ``causal=False``).

Scores are scaled by 1/sqrt(head_dim), masked and normalised in float32 even
when the compute dtype is bfloat16. Parameters (names and logical axes):

    query, key, value, pos_key: {'kernel': [D, H, dh]}  ('embed', 'heads', 'kv')
    out:                        {'kernel': [H, dh, D]}  ('heads', 'kv', 'embed')
    u, v (or v_plus, v_minus):  [H, dh]                 ('heads', 'kv')

The biases are per layer (Transformer-XL's code shares them across layers).
"""

from __future__ import annotations

import functools
import math
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax.models import attention as attention_lib
from memjax.methods.recurrent import memory as rmemory

# Masked scores get this value: exp(NEG_INF - anything finite) is exactly 0 in
# float32, and a fully masked row stays finite (never NaN).
NEG_INF: float = -1e30

POSITION_SCHEMES: tuple[str, ...] = ("xl", "disentangled")


def sinusoid_positions(positions: jax.Array, dim: int) -> jax.Array:
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


def rel_shift(x: jax.Array) -> jax.Array:
  """Transformer-XL's relative shift (pad a zero column, reshape, drop a row).

  Turns scores computed per (query, relative-distance column) into scores
  per (query, key). With x of shape [..., Q, P]:

      y[..., i, j] = x[..., i, j + Q - 1 - i]   whenever j + Q - 1 - i < P,

  i.e. row i is shifted left by Q - 1 - i columns. Entries with
  j + Q - 1 - i >= P hold junk (the zero pad or the next row's values) and
  must be masked by the caller.

  Convention used in this package: column c of x belongs to the relative
  distance delta_c = delta_top - c (query position minus key position,
  descending), where delta_top is the distance between the LAST query and
  the FIRST key. Then y[..., i, j] belongs to query i and key j. For causal
  Transformer-XL attention with Q queries at the end of K keys, P = K and
  delta_top = K - 1, and the junk entries are exactly the future keys j > i
  + K - Q.

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


def masked_softmax(
    scores: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Softmax over the last axis with a mask, and its log-normaliser.

  Args:
      scores: [..., K] float32 scaled scores.
      mask: bool, broadcastable to ``scores``; False entries are excluded.

  Returns:
      (probs [..., K] float32 with exact zeros where masked,
       lse [...] float32 logsumexp of the unmasked scores).
  """
  scores = jnp.where(mask, scores, NEG_INF)
  lse = jax.nn.logsumexp(scores, axis=-1)
  probs = jnp.exp(scores - lse[..., None])
  return probs, lse


class HeadProjection(nn.Module):
  """Bias-free projection to heads: [..., D] -> [..., H, dh].

  Parameter: kernel [D, H, dh], logical axes ('embed', 'heads', 'kv').
  """

  num_heads: int
  head_dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
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
  """Bias-free projection from heads: [..., H, dh] -> [..., D].

  Parameter: kernel [H, dh, D], logical axes ('heads', 'kv', 'embed').
  """

  d_model: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
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


class RelativeAttentionBase(attention_lib.AttentionKind):
  """Parameters and score computation shared by the relative attentions.

  Not used directly: ``XLAttention``, ``DisentangledAttention`` and
  ``memjax.methods.recurrent.lamemo.LaMemoAttention`` build on it, so the three share
  one parameter structure per position scheme.

  Attributes:
      d_model: D, model width (also the sinusoid size).
      num_heads: H.
      head_dim: dh.
      mem_len: slots kept in the returned memory; 0 keeps as many as the
          incoming memory has.
      dropout_rate: dropout on the attention probabilities.
      dtype: compute dtype (float32 or bfloat16). Scores, softmax and
          log-normalisers are always float32.
      param_dtype: parameter dtype.
  """

  d_model: int
  num_heads: int
  head_dim: int
  mem_len: int = 0
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def position_scheme(self) -> str:
    """'xl' or 'disentangled'."""
    raise NotImplementedError

  def setup(self) -> None:
    scheme = self.position_scheme()
    if scheme not in POSITION_SCHEMES:
      raise ValueError(
          f"position scheme must be one of {POSITION_SCHEMES}, got "
          f"{scheme!r}"
      )
    proj = functools.partial(
        HeadProjection,
        num_heads=self.num_heads,
        head_dim=self.head_dim,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    self.query = proj()
    self.key = proj()
    self.value = proj()
    self.pos_key = proj()
    self.out = OutputProjection(
        d_model=self.d_model, dtype=self.dtype, param_dtype=self.param_dtype
    )
    bias_init = nn.with_logical_partitioning(
        nn.initializers.normal(stddev=0.02), ("heads", "kv")
    )
    shape = (self.num_heads, self.head_dim)
    self.u = self.param("u", bias_init, shape, self.param_dtype)
    if scheme == "xl":
      self.v = self.param("v", bias_init, shape, self.param_dtype)
    else:
      self.v_plus = self.param("v_plus", bias_init, shape, self.param_dtype)
      self.v_minus = self.param("v_minus", bias_init, shape, self.param_dtype)
    self.attn_dropout = nn.Dropout(rate=self.dropout_rate)

  def _position_table(self, deltas: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Projected encodings and global biases for relative distances.

    Args:
        deltas: [P] int32 distances (query minus key position).

    Returns:
        (r [P, H, dh] compute dtype: W_kR R for each distance,
         bias [P, H, dh] float32: the global position bias b of Eq. 6/12).
    """
    shape = (deltas.shape[0], self.num_heads, self.head_dim)
    if self.position_scheme() == "xl":
      positions = deltas
      bias = jnp.broadcast_to(jnp.asarray(self.v, jnp.float32), shape)
    else:
      positions = jnp.abs(deltas)
      bias = jnp.where(
          (deltas >= 0)[:, None, None],
          jnp.asarray(self.v_plus, jnp.float32),
          jnp.asarray(self.v_minus, jnp.float32),
      )
    enc = sinusoid_positions(positions.astype(jnp.float32), self.d_model)
    r = self.pos_key(enc.astype(self.dtype))
    return r, bias

  def _scores(
      self,
      q: jax.Array,
      k: jax.Array,
      delta_top: int,
      past_only: bool,
  ) -> jax.Array:
    """Scaled relative attention scores (Eq. 6 or Eq. 12).

    Queries and keys are consecutive runs of positions; query i and key j
    are ``delta_top - (Q - 1 - i) - j`` positions apart.

    Args:
        q: [B, Q, H, dh] queries W_q x.
        k: [B, K, H, dh] content keys W_kE x.
        delta_top: distance (query minus key position) of the last query
            and the first key.
        past_only: whether only keys at or before the query (distance >= 0)
            will be read; then fewer distances are encoded and the other
            entries of the result are junk (to be masked).

    Returns:
        [B, H, Q, K] float32 scores divided by sqrt(dh).
    """
    q_len, k_len = q.shape[1], k.shape[1]
    if past_only:
      num_cols = max(k_len, delta_top + 1)
    else:
      num_cols = k_len + q_len - 1
    deltas = delta_top - jnp.arange(num_cols, dtype=jnp.int32)
    r, bias = self._position_table(deltas)
    f32 = jnp.float32
    u = jnp.asarray(self.u, f32)
    # Terms (a) + (c): content score and global content bias.
    content = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32)
    content += jnp.einsum("hd,bkhd->bhk", u, k.astype(f32))[:, :, None, :]
    # Terms (b) + (d): position score and global position bias, per
    # distance column, then shifted to per-key columns.
    position = jnp.einsum("bqhd,phd->bhqp", q, r, preferred_element_type=f32)
    position += jnp.einsum("phd,phd->hp", bias, r.astype(f32))[None, :, None]
    position = rel_shift(position)[..., :k_len]
    return (content + position) * (1.0 / math.sqrt(self.head_dim))

  def _attend(
      self,
      scores: jax.Array,
      mask: jax.Array,
      v: jax.Array,
      deterministic: bool,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Masked softmax, dropout and the weighted sum of values.

    Args:
        scores: [B, H, Q, K] float32.
        mask: bool broadcastable to ``scores``.
        v: [B, K, H, dh] values.
        deterministic: disables dropout.

    Returns:
        (c [B, Q, H, dh] float32 attention output vectors,
         lse [B, Q, H] float32 log-normalisers,
         probs [B, H, Q, K] float32, before dropout).
    """
    probs, lse = masked_softmax(scores, mask)
    dropped = self.attn_dropout(probs, deterministic=deterministic)
    c = jnp.einsum(
        "bhqk,bkhd->bqhd",
        dropped.astype(self.dtype),
        v,
        preferred_element_type=jnp.float32,
    )
    return c, jnp.swapaxes(lse, 1, 2), probs

  def _project(self, x: jax.Array) -> jax.Array:
    """Output projection of [B, L, H, dh] vectors to [B, L, D] (dtype)."""
    y = self.out(x.astype(self.dtype))
    return nn.with_logical_constraint(y, ("batch", "length", "embed"))


def _heads_constraint(x: jax.Array) -> jax.Array:
  return nn.with_logical_constraint(x, ("batch", "length", "heads", "kv"))


class _SegmentAttention(RelativeAttentionBase):
  """Relative attention of the current segment over (memory, segment)."""

  causal: bool = True

  @classmethod
  def init_layer_memory(
      cls, batch_size: int, dims: attention_lib.StackDims
  ) -> rmemory.XLMemory:
    """Empty memory of one layer: ``XLMemory`` with x [B, M, D] dtype."""
    return rmemory.init_xl_memory(
        batch_size, dims.mem_len, dims.d_model, dims.dtype
    )

  def init_memory(
      self, batch_size: int, mem_len: int | None = None
  ) -> rmemory.XLMemory:
    """Empty memory for this layer: ``XLMemory`` with x [B, M, D] dtype."""
    return rmemory.init_xl_memory(
        batch_size,
        self.mem_len if mem_len is None else mem_len,
        self.d_model,
        self.dtype,
    )

  def __call__(
      self,
      x: jax.Array,
      memory: rmemory.XLMemory | None,
      *,
      deterministic: bool,
  ) -> tuple[jax.Array, rmemory.XLMemory | None]:
    """Attends from the segment over the memory and the segment.

    Args:
        x: [B, T, D] layer input after the pre-LayerNorm.
        memory: ``XLMemory`` with x [B, M, D] (the previous normed layer
            inputs) or None for no memory (Transformer+RPE).
        deterministic: disables attention dropout.

    Returns:
        (y [B, T, D] compute dtype, after the output projection;
         new memory: the last ``mem_len`` (or M) rows of
         concat(memory.x, x), stop-gradient; None if memory is None).

    Sows (collection 'intermediates', only when it is mutable):
        attention_probs: [B, H, T, M + T] float32.
    """
    x = nn.with_logical_constraint(
        x.astype(self.dtype), ("batch", "length", "embed")
    )
    batch, seg_len, _ = x.shape
    if memory is None:
      mem_x = jnp.zeros((batch, 0, self.d_model), self.dtype)
      mem_valid = jnp.zeros((batch, 0), jnp.bool_)
    else:
      mem_x = jax.lax.stop_gradient(memory.x).astype(self.dtype)
      mem_x = nn.with_logical_constraint(mem_x, ("batch", "mem", "embed"))
      mem_valid = memory.valid
    mem_len = mem_x.shape[1]
    context = jnp.concatenate([mem_x, x], axis=1)
    q = _heads_constraint(self.query(x))
    k = _heads_constraint(self.key(context))
    v = _heads_constraint(self.value(context))

    total = mem_len + seg_len
    scores = self._scores(q, k, delta_top=total - 1, past_only=self.causal)
    key_valid = jnp.concatenate(
        [mem_valid, jnp.ones((batch, seg_len), jnp.bool_)], axis=1
    )
    mask = key_valid[:, None, None, :]
    if self.causal:
      query_pos = mem_len + jnp.arange(seg_len)
      mask = mask & (jnp.arange(total)[None, :] <= query_pos[:, None])
    c, _, probs = self._attend(scores, mask, v, deterministic)
    self.sow("intermediates", "attention_probs", probs)
    y = self._project(c)

    if memory is None:
      return y, None
    new_len = self.mem_len if self.mem_len > 0 else mem_len
    return y, rmemory.push_xl_memory(memory, x, new_len)


class XLAttention(_SegmentAttention):
  """Transformer-XL relative attention (Dai et al. 2019; LaMemo Eq. 6).

  Query i (absolute position M + i) reads memory slots and segment
  positions <= i; invalid memory slots are masked. The memory is the last
  ``mem_len`` normed layer inputs (``XLMemory``, compute dtype). With
  ``memory=None`` this is the Transformer+RPE baseline.

  Attributes (besides those of ``RelativeAttentionBase``):
      causal: mask keys to the right of the query (default True).

  Registered as the 'xl' attention kind: a model with ``mem_len > 0``
  carries one ``XLMemory`` per layer across segments.

  Parameters: query, key, value, pos_key, out, u, v (see module docstring).
  """

  POSITION: ClassVar[str] = "xl"
  RECURRENT: ClassVar[bool] = True

  def position_scheme(self) -> str:
    return self.POSITION


class DisentangledAttention(_SegmentAttention):
  """Relative attention with disentangled positions (LaMemo Eq. 12).

  R of |i - j| and two learned direction biases, v_plus (i >= j) and
  v_minus (i < j). Same call contract and memory as ``XLAttention``. For
  causal attention only v_plus is read; ``causal=False`` attends in both
  directions.

  Registered as the 'rpe' attention kind (the Transformer+RPE baseline): a
  model of this kind carries no memory across segments.

  Parameters: query, key, value, pos_key, out, u, v_plus, v_minus.
  """

  POSITION: ClassVar[str] = "disentangled"

  def position_scheme(self) -> str:
    return self.POSITION
