"""The one multi-head attention core: every attention path computes with it.

``MultiHeadAttention`` projects queries (H heads) and keys and values
(``num_kv_heads`` heads, each shared by H / H_kv query heads: grouped-query
attention, as Hugging Face's ``repeat_kv``), scores them with optional
positions, masks and an additive bias, normalises in float32, drops
probabilities out and projects the heads back to D. The paths that use it,
with their options:

* the 'vanilla' kind (``attention.CausalSelfAttention``): causal, rotary
  positions or none (the family adds absolute ones), the pretrained
  families' biases and grouped heads;
* the relative kinds ('rpe', 'xl', LaMemo's 'lamemo' in
  ``memjax/methods/recurrent``): Transformer-XL's four score terms
  (``relative_positions.relative_scores``) in the 'xl' or 'disentangled'
  scheme, over a memory and the segment or in both directions (LaMemo's
  look-ahead);
* the encoders' and the translation model's attention (``seq2seq``): a
  padding mask, a causal decoder with its decoding cache, and
  cross-attention to keys and values computed once per source (``kv``);
* MARGE's cross-attention to retrieved sources, whose similarity bias is
  added to the scores (``bias``).

Scores are computed, masked and normalised in float32 whatever the compute
dtype; a query that may attend to no key gets zero probabilities (MARGE's
lanes without a retrieved source).

Parameter layouts, kept as the runs of each path saved
them, with the initialisers those paths have always used:

* 'param': query, key, value [D, H, d_h] ('embed', 'heads', 'kv') and out
  [H, d_h, D] ('heads', 'kv', 'embed'), Glorot-uniform over the fan of
  every axis; optional biases ``<name>_bias``. The engine's attention, the
  encoders' and MARGE's.
* 'module': sub-layers query, key, value, pos_key and out, each with a
  ``kernel`` of those shapes, LeCun-normal (JAX's default for a dense
  kernel, which the relative kinds were written with); the relative
  biases u and v (or v_plus, v_minus) [H, d_h], normal(0.02).

``dropout_name`` names the dropout sub-module as each path always has (its
random masks are drawn from the module's name).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from memjax import errors
from memjax.models import blocks
from memjax.models import relative_positions
from memjax.models import rolling_cache
from memjax.models import rotary
from memjax.models import stack

Array = jax.Array

NEG_INF = relative_positions.NEG_INF
PROJECTIONS = ("param", "module")
RELATIVE = ("", "xl", "disentangled")
HEADS_AXES = ("batch", "length", "heads", "kv")


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


class MultiHeadAttention(nn.Module):
  """Multi-head attention (see the module docstring).

  Attributes:
    d_model: D.
    num_heads: H.
    head_dim: d_h.
    dropout_rate: dropout on the attention probabilities.
    dtype: compute dtype; scores and softmax are float32.
    num_kv_heads: key/value heads (a divisor of H); 0 = H.
    qkv_bias: biases on the query, key and value projections ('param').
    out_bias: a bias on the output projection ('param').
    rope: the rotary positions' settings (``rotary.Rope``), or None.
    qk_norm: '' (none) or a norm kind (``blocks.NORMS``: 'rms') applied to
      each head's queries and keys over d_h, after their biases and before
      rotary positions (Qwen3's q_norm and k_norm), its scale
      ``query_norm/scale`` and ``key_norm/scale`` [d_h].
    qk_norm_epsilon: those norms' epsilon.
    query_pre_attn_scalar: the plain scores are divided by its square
      root (Gemma's); 0 = by sqrt(d_h).
    sliding_window: a causal query reads only the last ``sliding_window``
      positions, itself included (Hugging Face's ``kv_idx > q_idx -
      sliding_window``); 0 = every earlier position.
    relative: '' (none), or the relative positions' scheme: 'xl' (R of the
      signed distance, one position bias v) or 'disentangled' (R of |i - j|,
      biases v_plus for i >= j and v_minus for i < j; LaMemo Eq. 12).
    projections: the parameter layout, 'param' or 'module'.
    dropout_name: the dropout sub-module's name.
    param_dtype: the parameters' dtype.
  """

  d_model: int
  num_heads: int
  head_dim: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  num_kv_heads: int = 0
  qkv_bias: bool = False
  out_bias: bool = False
  rope: Optional[rotary.Rope] = None
  qk_norm: str = ""
  qk_norm_epsilon: float = 1e-6
  query_pre_attn_scalar: float = 0.0
  sliding_window: int = 0
  relative: str = ""
  projections: str = "param"
  dropout_name: str = "Dropout_0"
  param_dtype: Any = jnp.float32

  def setup(self) -> None:
    if self.projections not in PROJECTIONS or self.relative not in RELATIVE:
      raise ValueError(
          f"projections {self.projections!r} must be one of {PROJECTIONS} "
          f"and relative {self.relative!r} one of {RELATIVE}"
      )
    if self.relative and (self.projections != "module" or self.rope):
      raise ValueError("relative positions take the 'module' layout, no rope")
    kv = self.kv_heads()
    if self.projections == "param":
      self._param_layout(kv)
    else:
      self._module_layout(kv)
    if self.qk_norm:
      make = functools.partial(
          blocks.make_norm,
          self.qk_norm,
          None,
          self.dtype,
          self.qk_norm_epsilon,
          axis="kv",
      )
      self.query_norm, self.key_norm = make(), make()
    setattr(self, self.dropout_name, nn.Dropout(self.dropout_rate))

  def _param_layout(self, kv: int) -> None:
    """query, key, value, out (and their biases) in the order the paths
    made them (a parameter's initial value depends on that order)."""
    axes = ("embed", "heads", "kv")
    zeros = nn.initializers.zeros
    w, b = {}, {}
    for name, heads in (("query", self.num_heads), ("key", kv), ("value", kv)):
      w[name] = self.param(
          name,
          nn.with_logical_partitioning(qkv_init(), axes),
          (self.d_model, heads, self.head_dim),
      )
      if self.qkv_bias:
        b[name] = self.param(
            f"{name}_bias",
            nn.with_logical_partitioning(zeros, ("heads", "kv")),
            (heads, self.head_dim),
        )
    w["out"] = self.param(
        "out",
        nn.with_logical_partitioning(out_init(), ("heads", "kv", "embed")),
        (self.num_heads, self.head_dim, self.d_model),
    )
    if self.out_bias:
      b["out"] = self.param(
          "out_bias",
          nn.with_logical_partitioning(zeros, ("embed",)),
          (self.d_model,),
      )
    self.weights, self.biases = w, b

  def _module_layout(self, kv: int) -> None:
    """Sub-layers query, key, value, pos_key, out; biases u and v."""
    proj = functools.partial(
        relative_positions.HeadProjection,
        head_dim=self.head_dim,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    self.query = proj(num_heads=self.num_heads)
    self.key = proj(num_heads=kv)
    self.value = proj(num_heads=kv)
    if self.relative:
      self.pos_key = proj(num_heads=self.num_heads)
    self.out = relative_positions.OutputProjection(
        d_model=self.d_model, dtype=self.dtype, param_dtype=self.param_dtype
    )
    if not self.relative:
      return
    bias_init = nn.with_logical_partitioning(
        nn.initializers.normal(stddev=0.02), ("heads", "kv")
    )
    shape = (self.num_heads, self.head_dim)
    self.u = self.param("u", bias_init, shape, self.param_dtype)
    if self.relative == "xl":
      self.v = self.param("v", bias_init, shape, self.param_dtype)
    else:
      self.v_plus = self.param("v_plus", bias_init, shape, self.param_dtype)
      self.v_minus = self.param("v_minus", bias_init, shape, self.param_dtype)

  # -- projections -----------------------------------------------------------

  def kv_heads(self) -> int:
    """The key/value heads.

    Raises:
      errors.ConfigError: a count that does not divide H.
    """
    n = self.num_kv_heads or self.num_heads
    if n <= 0 or self.num_heads % n:
      raise errors.ConfigError(
          f"model.attention_options.num_kv_heads {n} must divide "
          f"model.num_heads {self.num_heads}"
      )
    return n

  def project(self, x: Array, name: str) -> Array:
    """x [B, T, D] -> [B, T, heads, d_h] by the projection ``name``
    ('query', 'key', 'value'), queries and keys normalised (``qk_norm``)."""
    x = x.astype(self.dtype)
    if self.projections == "module":
      y = getattr(self, name)(x)
    else:
      y = jnp.einsum("btd,dhk->bthk", x, self.weights[name].astype(self.dtype))
      if name in self.biases:
        y = y + self.biases[name].astype(self.dtype)
    if self.qk_norm and name in ("query", "key"):
      y = getattr(self, f"{name}_norm")(y).astype(self.dtype)
    return y

  def kv(self, y: Array) -> tuple[Array, Array]:
    """[B, S, D] -> keys, values [B, S, H_kv, d_h] (a cross-attention's,
    computed once per source)."""
    return self.project(y, "key"), self.project(y, "value")

  def output(self, c: Array) -> Array:
    """[B, T, H, d_h] head outputs -> [B, T, D] (compute dtype)."""
    c = c.astype(self.dtype)
    if self.projections == "module":
      y = self.out(c)
      return nn.with_logical_constraint(y, ("batch", "length", "embed"))
    y = jnp.einsum("bthk,hkd->btd", c, self.weights["out"].astype(self.dtype))
    if "out" in self.biases:
      y = y + self.biases["out"].astype(self.dtype)
    return y

  # -- scores and normalisation ----------------------------------------------

  def scores(
      self,
      q: Array,
      k: Array,
      *,
      delta_top: int = 0,
      past_only: bool = True,
      bias: Optional[Array] = None,
  ) -> Array:
    """Scaled scores: (q.k + the relative terms) / sqrt(d_h) + bias (q.k
    / sqrt(``query_pre_attn_scalar``) + bias if that is set).

    Args:
      q: [B, Q, H, dh] queries.
      k: [B, K, H_kv, dh] keys (repeated to H heads here).
      delta_top, past_only: the relative terms'
        (``relative_positions.relative_scores``).
      bias: float32 broadcastable to [B, H, Q, K], added after scaling.

    Returns:
      [B, H, Q, K] float32.
    """
    k = self.repeat_kv(k)
    f32 = jnp.float32
    if not self.relative:  # As the plain paths have always computed it.
      s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32)
      s = s / jnp.sqrt(f32(self.query_pre_attn_scalar or self.head_dim))
      return s if bias is None else s + bias
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32)
    # The global content bias u . k_j, then the position terms, scaled as
    # Transformer-XL's code scales them.
    u = jnp.asarray(self.u, f32)
    s += jnp.einsum("hd,bkhd->bhk", u, k.astype(f32))[:, :, None, :]
    s = s + relative_positions.relative_scores(self, q, k, delta_top, past_only)
    s = s * (1.0 / math.sqrt(self.head_dim))
    return s if bias is None else s + bias

  def repeat_kv(self, x: Array) -> Array:
    """[B, K, H_kv, dh] -> [B, K, H, dh], each key head shared by H / H_kv
    query heads."""
    if x.shape[2] == self.num_heads:
      return x
    return jnp.repeat(x, self.num_heads // x.shape[2], axis=2)

  def attend(
      self,
      scores: Array,
      mask: Array,
      v: Array,
      deterministic: bool,
      *,
      empty_rows: bool = True,
  ) -> tuple[Array, Optional[Array], Array]:
    """Masked softmax, dropout and the weighted sum of values.

    The relative kinds read the log-normalisers (LaMemo interpolates with
    them): their probabilities are ``exp(s - lse)``. The plain paths' are
    ``softmax(s)``, as those paths have always computed them, and a row
    with no key is zeroed only where ``empty_rows`` says one may occur (a
    causal row always has its own key).

    Args:
      scores: [B, H, Q, K] float32.
      mask: bool broadcastable to ``scores``; True = may attend.
      v: [B, K, H_kv, dh] values.
      deterministic: disables dropout.
      empty_rows: whether a query may have no key to read.

    Returns:
      (c [B, Q, H, dh] head outputs (float32 for the relative kinds, the
       compute dtype otherwise), lse [B, Q, H] float32 log-normalisers (None
       on the plain paths), probs [B, H, Q, K] before dropout: float32, or
       the compute dtype where that is narrower).
    """
    drop = getattr(self, self.dropout_name)
    dropping = self.dropout_rate > 0 and not deterministic
    if not self.relative and self.dtype != jnp.float32 and not dropping:
      # Residuals in the compute dtype; a row with no key gets zeros. Not
      # under dropout: there the TPU compiler kept a float32 copy of the
      # dropout's uniform draws and of the probabilities' gradient besides
      # (trime_247m on a v4-8: 7.25 GiB of temporaries, 5.96 without).
      probs, _ = relative_positions.narrow_softmax(scores, mask, self.dtype)
      probs = checkpoint_name(probs, stack.ATTENTION_PROBS)
      dropped = drop(probs, deterministic=deterministic)
      c = jnp.einsum("bhqk,bkhd->bqhd", dropped, self.repeat_kv(v))
      return c, None, probs
    if not self.relative:
      probs = jax.nn.softmax(jnp.where(mask, scores, NEG_INF), axis=-1)
      if empty_rows:
        keys = jnp.broadcast_to(mask, scores.shape)
        any_key = keys.any(axis=-1, keepdims=True)
        probs = jnp.where(any_key, probs, 0.0)
      probs = checkpoint_name(probs, stack.ATTENTION_PROBS)
      dropped = drop(probs, deterministic=deterministic)
      c = jnp.einsum(
          "bhqk,bkhd->bqhd", dropped.astype(self.dtype), self.repeat_kv(v)
      )
      return c, None, probs
    if self.dtype == jnp.float32:
      probs, lse = relative_positions.masked_softmax(scores, mask)
    else:  # Residuals in the compute dtype.
      probs, lse = relative_positions.narrow_softmax(scores, mask, self.dtype)
    probs = checkpoint_name(probs, stack.ATTENTION_PROBS)
    c = jnp.einsum(
        "bhqk,bkhd->bqhd",
        drop(probs, deterministic=deterministic).astype(self.dtype),
        self.repeat_kv(v),
        preferred_element_type=jnp.float32,
    )
    return c, jnp.swapaxes(lse, 1, 2), probs

  # -- the plain path --------------------------------------------------------

  def __call__(
      self,
      x: Array,
      cache: Optional[tuple[Array, Array]] = None,
      *,
      deterministic: bool,
      mask: Optional[Array] = None,
      causal: bool = False,
      kv: Optional[tuple[Array, Array]] = None,
      bias: Optional[Array] = None,
      pos: Optional[Array] = None,
      positions: Optional[Array] = None,
  ) -> tuple[Array, Optional[tuple[Array, Array]]]:
    """Self-attention of x, or (``kv`` given) cross-attention: the calling
    convention of a block's attention sub-layers (``blocks.ResidualBlock``).

    Args:
      x: [B, T, D] the queries' inputs (normalised).
      cache: self-attention, one decoder step: the (keys, values)
        [B, T_max, H_kv, d_h] so far, x being the token at ``pos``, or a
        sliding-window layer's ``rolling_cache`` (keys, values, slots);
        else None.
      deterministic: disables dropout.
      mask: bool broadcastable to [B, H, T, S]; True = may attend; None =
        every key.
      causal: also mask keys after the query (self-attention), and those
        ``sliding_window`` or more positions before it.
      kv: cross-attention: keys and values [B, S, H_kv, d_h] (``kv``).
      bias: float32 broadcastable to [B, H, T, S], added to the scores.
      pos: with a cache: scalar int32, the slot of x's first row (a causal
        query at slot i reads slots <= i, within ``sliding_window``).
      positions: [B, T] int32 x's rotary positions; None = the slots.

    Returns:
      ([B, T, D], the cache with x's keys and values at ``pos``, or None
      without a cache).
    """
    x = x.astype(self.dtype)
    q = self.project(x, "query")
    # Only a decoder's cache may roll (training never reaches the module).
    rolling = cache is not None and rolling_cache.is_rolling(cache)
    keep = None
    if kv is None:
      k, v = self.kv(x)
      if self.rope is not None:  # Positions: 0..T-1, the slots, or given.
        if positions is None and cache is not None:
          positions = jnp.broadcast_to(
              pos + jnp.arange(x.shape[1]), x.shape[:2]
          )
        table = x.shape[1] if cache is None else cache[0].shape[1]
        if rolling:  # The text's positions, which its mask spans.
          table = mask.shape[-1]
        q, k = rotary.rotate_qk(self.rope, q, k, positions, table)
      if rolling:  # Its own mask: causal, windowed, by position.
        k, v, keep, cache = rolling_cache.extend(
            cache, k, v, pos, mask, self.sliding_window
        )
      elif cache is not None:
        k = jax.lax.dynamic_update_slice_in_dim(cache[0], k, pos, axis=1)
        v = jax.lax.dynamic_update_slice_in_dim(cache[1], v, pos, axis=1)
        cache = (k, v)
    else:
      k, v = kv
    q = nn.with_logical_constraint(q, HEADS_AXES)
    k = nn.with_logical_constraint(k, HEADS_AXES)
    if keep is None:
      keep = jnp.ones((), bool) if mask is None else mask
    if causal and not rolling:  # Query slot pos + i reads slots <= pos + i.
      at, w = (0 if cache is None else pos), self.sliding_window
      keep = keep & cached_causal_mask(x.shape[1], k.shape[1], at, w)
    s = self.scores(q, k, bias=bias)
    c, _, _ = self.attend(
        s, keep, v, deterministic, empty_rows=mask is not None
    )
    return self.output(c), cache


def core_of(layer: nn.Module, **options: Any) -> MultiHeadAttention:
  """The core with an attention layer's sizes, dropout and dtype (its
  fields ``d_model``, ``num_heads``, ``head_dim``, ``dropout_rate``,
  ``dtype``) and ``options``. The layer assigns it in ``setup`` and shares
  its scope (``nn.share_scope``), so the core's parameters keep the paths
  the layer saved."""
  return MultiHeadAttention(
      d_model=layer.d_model,
      num_heads=layer.num_heads,
      head_dim=layer.head_dim,
      dropout_rate=layer.dropout_rate,
      dtype=layer.dtype,
      **options,
  )
