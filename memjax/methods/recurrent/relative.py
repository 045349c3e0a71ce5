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

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import extend
from memjax.models import attention as attention_lib
from memjax.models import multihead
from memjax.methods.recurrent import segment_memory as rmemory

POSITION_SCHEMES: tuple[str, ...] = ("xl", "disentangled")


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
      options: the kind's options (``model.attention_options``): 'xl' and
          'rpe' take none, 'lamemo' its ``LaMemoOptions``.
  """

  d_model: int
  num_heads: int
  head_dim: int
  mem_len: int = 0
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  options: extend.NoOptions = extend.NoOptions()  # 'xl', 'rpe': none.

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
    # The one attention core, its parameters directly in this layer's
    # scope (query, key, value, pos_key, out, u, v...: the saved paths).
    self.core = multihead.core_of(
        self,
        relative=scheme,
        projections="module",
        dropout_name="attn_dropout",
        param_dtype=self.param_dtype,
    )
    nn.share_scope(self, self.core)

  def _project(self, x: jax.Array) -> jax.Array:
    """Output projection of [B, L, H, dh] vectors to [B, L, D] (dtype)."""
    return self.core.output(x)

  def decode_step(
      self,
      x: jax.Array,
      cache: tuple[jax.Array, jax.Array],
      pos: jax.Array,
      mask: jax.Array | None,
  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Causal decoding steps from a cache of content keys and values (the
    translation decoder's, one token at a time; the LM's, a prefill then
    one token at a time): the token at slot ``pos + i`` reads the keys at
    distances ``pos + i - j`` (the relative terms need no more than the
    cached keys).

    Args:
        x: [B, Q, D] the normed inputs at slots pos .. pos + Q - 1.
        cache: (keys, values) [B, T_max, H, dh] of the steps so far.
        pos: scalar int32 slot of x's first row.
        mask: bool broadcastable to [B, H, Q, T_max], True = may attend
            (besides the causal rule), or None.

    Returns:
        ([B, Q, D], the cache with x's keys and values from ``pos`` on).
    """
    q = self.core.project(x, "query")
    k, v = (
        jax.lax.dynamic_update_slice_in_dim(
            c, self.core.project(x, name), pos, axis=1
        )
        for c, name in zip(cache, ("key", "value"))
    )
    rows = pos + jnp.arange(x.shape[1])[:, None]
    keep = (jnp.arange(k.shape[1])[None, :] <= rows)[None, None]
    if mask is not None:
      keep = keep & mask
    delta_top = pos + x.shape[1] - 1
    scores = self.core.scores(q, k, delta_top=delta_top, past_only=True)
    c, _, _ = self.core.attend(scores, keep, v, True)
    return self._project(c), (k, v)


def _heads_constraint(x: jax.Array) -> jax.Array:
  return nn.with_logical_constraint(x, ("batch", "length", "heads", "kv"))


class _SegmentAttention(RelativeAttentionBase):
  """Relative attention of the current segment over (memory, segment).

  Both decode with a key/value cache (``decode_step``). A recurrent kind's
  memory holds the layer inputs of the M positions before the segment,
  whose keys and values are those the cache keeps of them, so a query at
  stream position p reads positions (p // T) * T - M .. p. Without a
  memory a query reads every cached position of its row; the decoder
  keeps evaluation's windows (``models.decode_windows``).
  """

  @classmethod
  def decodes_cached(cls, mem_len: int) -> bool:
    del mem_len
    return True

  @classmethod
  def cached_context(
      cls, query: jax.Array, segment_len: int, mem_len: int
  ) -> jax.Array:
    if not cls.carries_memory(mem_len):
      return jnp.zeros_like(query)
    return (query // segment_len) * segment_len - mem_len

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
      memory: rmemory.XLMemory | None = None,
      *,
      deterministic: bool,
      mask: jax.Array | None = None,
      pos: jax.Array | None = None,
      positions: jax.Array | None = None,
  ) -> tuple[jax.Array, rmemory.XLMemory | None]:
    """Attends from the segment over the memory and the segment.

    Args:
        x: [B, T, D] layer input after the pre-LayerNorm.
        memory: ``XLMemory`` with x [B, M, D] (the previous normed layer
            inputs) or None for no memory (Transformer+RPE); with ``pos``,
            a translation decoder's cache (``decode_step``).
        deterministic: disables attention dropout.
        mask: bool broadcastable to [B, H, T, M + T], True = may attend (an
            encoder's padding mask), or None.
        pos: one decoding step's position (``decode_step``), or None.
        positions: ignored (the cached decoder's absolute positions: the
            relative terms read slot distances).

    Returns:
        (y [B, T, D] compute dtype, after the output projection;
         new memory: the last ``mem_len`` (or M) rows of
         concat(memory.x, x), stop-gradient; None if memory is None).

    Sows (collection 'intermediates', only when it is mutable):
        attention_probs: [B, H, T, M + T] float32.
    """
    del positions
    if pos is not None:
      return self.decode_step(x, memory, pos, mask)
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
    q = _heads_constraint(self.core.project(x, "query"))
    k = _heads_constraint(self.core.project(context, "key"))
    v = _heads_constraint(self.core.project(context, "value"))

    total = mem_len + seg_len
    scores = self.core.scores(q, k, delta_top=total - 1, past_only=self.causal)
    key_valid = jnp.concatenate(
        [mem_valid, jnp.ones((batch, seg_len), jnp.bool_)], axis=1
    )
    keep = key_valid[:, None, None, :]
    if mask is not None:
      keep = keep & mask
    if self.causal:
      query_pos = mem_len + jnp.arange(seg_len)
      keep = keep & (jnp.arange(total)[None, :] <= query_pos[:, None])
    c, _, probs = self.core.attend(scores, keep, v, deterministic)
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
