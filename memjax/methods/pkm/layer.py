"""Product-key memory (Lample et al. 2019) and residual memory (Kim & Jung).

``ProductKeyMemory`` maps [B, T, D] to [B, T, V]: per head a query network
(linear, then LayerNorm, or BatchNorm over the non-padding positions) gives
q [k_dim]; its halves are scored against two sub-key sets of C keys of
dimension k_dim / 2; the top k of each half give k^2 candidate slots whose
score is the sum of the two halves' scores; the top k of those are
softmaxed, their value rows gathered, weighted and summed over the heads.
The memory has C^2 slots, but the forward pass only ever holds [N, H, C]
sub-key scores and [N, H, k^2] candidate sums, never a [tokens, slots]
array.

Two feed-forward kinds (``PKM``, ``RESM``) put the memory in
a block, following Kim & Jung's section 4.2,
``x' = LN(x + alpha FFN(x) + beta PKM(x))``:

* ``pkm``: (alpha, beta) = (0, 1), the memory replaces the FFN;
* ``resm``: (1, 1), the memory is added to the FFN (residual memory).

The block applies the kind as its feed-forward sub-layer, so under post-LN
(``model.norm_position='post'``) the formula is exactly the block's
``LN2(h + Drop(f(h)))``; under pre-LN it is ``h + Drop(f(LN2(h)))``: both
terms read the same normalised input. ``model.feed_forward_layers`` picks the
(1-based) layers that use the kind; the others use the plain ``ffn``.

Parameters of the memory (module ``memory`` inside the kind): ``query``
{kernel [D, H*k_dim], bias}, ``query_norm`` (LayerNorm or BatchNorm
scale/bias [H*k_dim]), ``keys`` [H, 2, C, k_dim/2], ``values`` [C^2, V]
with logical axes ('memory_slots', 'embed'): the table shards over the
``tensor`` mesh axis. Train the values with ``optim.groups`` and the
``lazy_adam`` transform (``memjax.methods.pkm.lazy_adam``).

Usage statistics: with the ``'aux'`` collection mutable the memory reports,
per call, MU, top-1 MU, KL_u and KL_w of that call's reads
(``memjax.models.variables``); with ``'pkm_usage'`` mutable it sows per-slot sums
(read counts, top-1 counts, weights; the counts per token as Kim & Jung
define them, and per head as ``reads_per_head``, ``top1_per_head``) that
``--mode=memory_usage`` adds over held-out data
(``memjax.methods.pkm.usage``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.methods.pkm import bag
from memjax.methods.pkm import counts
from memjax.methods.pkm import sharded
from memjax.models import feed_forward
from memjax.models import variables as model_vars

Array = jax.Array
USAGE_COLLECTION = "pkm_usage"
QUERY_NORMS = ("layer", "batch")
READS = ("bag", "gather")
# Options that change how the memory is read, not its weights.
READ_OPTIONS = ("read", "read_group")
# Model families whose positions must not see later ones: batch statistics
# over a batch would leak them.
CAUSAL_FAMILIES = ("decoder_lm",)
# The option that lets a causal model take the query BatchNorm anyway.
LEAK_SWITCH = "allow_batchnorm_future_leak"


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
  """``model.feed_forward_options`` of the memory kinds ('pkm', 'resm',
  'memory_plus'), read by ``MemoryFeedForward`` and its
  ``ProductKeyMemory``.

  Attributes:
    num_keys: C, sub-keys per half; the memory has C^2 slots.
    heads: H, query heads.
    topk: k, slots read per head.
    k_dim: query and full-key dimension (even).
    query_norm: 'layer' (LayerNorm, for causal models) or 'batch'
      (BatchNorm over non-padding positions; running statistics in
      'batch_stats', Flax momentum 0.9 = PyTorch's 0.1).
    read: 'bag' (``bag.read``: a loop over groups of the H*k columns with
      its own gradient, no [.., H*k, V] temporary) or 'gather'
      (``jnp.take`` then a weighted sum: the plain form, the reference).
    read_group: columns per step of the 'bag' read (0 = up to 8).
    qk_norm: scale the query halves and the sub-keys to unit RMS before
      scoring (Memory+, Berges et al. 2025; off in Lample et al.).
    gate: pass the memory's output through Memory+'s gate
      ``(m ⊙ silu(x W1)) W2`` (modules ``gate_in``, ``gate_out``).
    shared_values: read the model's one values table (``ffn_shared/
      values``, Memory+'s shared pool) instead of a table per layer, each
      layer keeping its own queries and keys.
    zero_values: values initialised to zero (the memory reads 0 until
      trained: a memory added to a pretrained model leaves it unchanged).
    activation_dropout: the FFN's dropout after its activation ('resm';
      < 0 = the model's dropout).
    allow_batchnorm_future_leak: let a causal model (``CAUSAL_FAMILIES``)
      take ``query_norm='batch'``, whose batch statistics mix every
      position, later ones included (checked by ``check_model`` only).
    base: the FFN's kind, and that of the layers without a memory: 'ffn'
      or 'glu' (gate, up, down: a pretrained Llama's).
  """

  num_keys: int = 512
  heads: int = 4
  topk: int = 32
  k_dim: int = 256
  query_norm: str = "layer"
  read: str = "bag"
  read_group: int = 0
  qk_norm: bool = False
  gate: bool = False
  shared_values: bool = False
  zero_values: bool = False
  activation_dropout: float = -1.0
  allow_batchnorm_future_leak: bool = False
  base: str = "ffn"


def product_key_topk(q: Array, keys: Array, topk: int) -> tuple[Array, Array]:
  """Top-k slots of product keys for each query and head.

  Args:
    q: [N, H, k_dim] queries.
    keys: [H, 2, C, k_dim/2] the two sub-key sets of each head.
    topk: k.

  Returns:
    (scores [N, H, k] float32, descending; slots [N, H, k] int32 in
    [0, C^2), slot = i1 * C + i2). Ties go to the lower index at each
    stage (``lax.top_k``).
  """
  c = keys.shape[2]
  half = q.shape[-1] // 2
  q = q.astype(jnp.float32)
  keys = keys.astype(jnp.float32)
  s1 = jnp.einsum("nhd,hcd->nhc", q[..., :half], keys[:, 0])
  s2 = jnp.einsum("nhd,hcd->nhc", q[..., half:], keys[:, 1])
  v1, i1 = jax.lax.top_k(s1, topk)  # [N, H, k]
  v2, i2 = jax.lax.top_k(s2, topk)
  a, b = candidate_pairs(topk)
  sums = v1[..., a] + v2[..., b]  # [N, H, P] of the k^2 sums
  scores, best = jax.lax.top_k(sums, topk)  # [N, H, k]
  a, b = jnp.asarray(a)[best], jnp.asarray(b)[best]
  slots = jnp.take_along_axis(i1, a, -1) * c + jnp.take_along_axis(i2, b, -1)
  return scores, slots.astype(jnp.int32)


def candidate_pairs(topk: int) -> tuple[np.ndarray, np.ndarray]:
  """(a, b) [P] int32: the pairs of sorted sub-key ranks whose sum can be
  among the top k, in the order of their index a * k + b in the k^2 grid.

  Both halves' scores come sorted (descending), so every pair (a', b') with
  a' <= a, b' <= b scores at least as high as (a, b) and comes before it
  in the grid: (a + 1) (b + 1) - 1 of them. Where that is k or more, (a, b)
  is never among the top k, ties included (``lax.top_k`` takes the lower
  index), so the top k of the P pairs with (a + 1) (b + 1) <= k are the
  top k of all k^2: 119 pairs instead of 1,024 at k = 32 (Lample et al.
  score all k^2).
  """
  a, b = np.nonzero(
      (np.arange(1, topk + 1)[:, None] * np.arange(1, topk + 1)[None, :])
      <= topk
  )
  return a.astype(np.int32), b.astype(np.int32)


def _values_init(vdim: int) -> tuple[Any, tuple[str, str]]:
  """The values' initializer (normal, std V^-1/2) and logical axes."""
  return nn.initializers.normal(vdim**-0.5), ("memory_slots", "embed")


def shared_params(options: Any, d_model: int) -> dict[str, Any]:
  """``shared_values``: one values table [C^2, D] for every memory layer."""
  if not options.get("shared_values"):
    return {}
  c = int(options.get("num_keys", MemoryOptions.num_keys))
  init, axes = _values_init(d_model)
  return {"values": (init, (c * c, d_model), axes)}


def _unit_rms(x: Array) -> Array:
  """x scaled to unit RMS over its last axis (float32)."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _qk_norm(q: Array, keys: Array) -> tuple[Array, Array]:
  """Memory+'s qk-norm, as memjax reads it: each product half of the
  queries [N, H, k_dim] and each sub-key [H, 2, C, k_dim/2] at unit RMS,
  with no learned scale."""
  half = q.shape[-1] // 2
  q = jnp.concatenate(
      [_unit_rms(q[..., :half]), _unit_rms(q[..., half:])], axis=-1
  )
  return q, _unit_rms(keys)


class ProductKeyMemory(nn.Module):
  """The product-key memory layer: [B, T, D] -> [B, T, value_dim].

  Attributes:
    d_model: D, the input width.
    value_dim: V, the width of the values and output (0 = D).
    dtype: compute dtype of the query network and of the output.
    options: its sizes and switches (``MemoryOptions``: num_keys C, heads
      H, topk k, k_dim, query_norm, read, read_group, qk_norm,
      zero_values; the others are ``MemoryFeedForward``'s).
  """

  d_model: int
  value_dim: int = 0
  dtype: Any = jnp.float32
  options: MemoryOptions = MemoryOptions()

  def _query(self, x: Array, mask: Array, deterministic: bool) -> Array:
    """[N, D] -> [N, H, k_dim] normalised queries."""
    o = self.options
    q = nn.Dense(
        o.heads * o.k_dim,
        dtype=self.dtype,
        name="query",
        kernel_init=nn.with_logical_partitioning(
            nn.initializers.xavier_uniform(), ("embed", None)
        ),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
    )(x)
    q = q.astype(jnp.float32)
    inits = dict(
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, (None,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
    )
    if o.query_norm == "batch":
      q = nn.BatchNorm(
          momentum=0.9,
          epsilon=1e-5,
          name="query_norm",
          dtype=jnp.float32,
          **inits,
      )(q, use_running_average=deterministic, mask=mask[:, None])
    else:
      q = nn.LayerNorm(
          epsilon=1e-5, name="query_norm", dtype=jnp.float32, **inits
      )(q)
    return q.reshape(q.shape[0], o.heads, o.k_dim)

  @nn.compact
  def __call__(
      self,
      x: Array,
      *,
      deterministic: bool,
      mask: Optional[Array] = None,
      values: Optional[Array] = None,
  ) -> Array:
    """[B, T, D] (and mask [B, T], 1 = real token) -> [B, T, V].

    Padding positions (mask 0) leave the batch statistics and the usage
    counts alone and output zeros. ``values`` [C^2, V]: a table shared
    with other layers, read instead of a table of the layer's own.
    """
    vdim = self.value_dim or self.d_model
    o = self.options
    c, h, k = o.num_keys, o.heads, o.topk
    lead = x.shape[:-1]
    xf = x.reshape(-1, x.shape[-1])
    valid = (
        jnp.ones(xf.shape[:1], bool)
        if mask is None
        else mask.reshape(-1).astype(bool)
    )
    q = self._query(xf, valid, deterministic)
    bound = 1.0 / np.sqrt(o.k_dim // 2)
    keys = self.param(
        "keys",
        nn.with_logical_partitioning(
            lambda key, shape: jax.random.uniform(
                key, shape, jnp.float32, -bound, bound
            ),
            (None, None, None, None),
        ),
        (h, 2, c, o.k_dim // 2),
    )
    if values is None:
      init, axes = _values_init(vdim)
      init = nn.initializers.zeros if o.zero_values else init
      values = self.param(
          "values", nn.with_logical_partitioning(init, axes), (c * c, vdim)
      )
    if o.qk_norm:
      q, keys = _qk_norm(q, keys)
    scores, slots = product_key_topk(q, keys, k)
    weights = jax.nn.softmax(scores, axis=-1)  # [N, H, k] float32
    self._report(slots, weights, valid)
    # The read keeps the rows and positions leading (a batch split over
    # devices stays split) and never holds [.., H*k, V] gathered rows.
    slots = slots.reshape(lead + (h * k,))
    weights = weights.reshape(lead + (h * k,))
    if o.read == "gather":
      out = bag.gather_read(values, slots, weights)
    else:
      out = sharded.read(values, slots, weights, o.read_group)
    out = jnp.where(valid.reshape(lead)[..., None], out, 0)
    return out.astype(self.dtype)

  def _report(self, slots: Array, weights: Array, valid: Array) -> None:
    """Usage statistics and per-slot sums, when their collection is mutable."""
    want_aux = self.is_mutable_collection(model_vars.COLLECTION)
    want_sums = self.is_mutable_collection(USAGE_COLLECTION)
    if not (want_aux or want_sums):
      return
    slots = jax.lax.stop_gradient(slots)
    weights = jax.lax.stop_gradient(weights)
    slots_total = self.options.num_keys**2
    sums = counts.usage_counts(slots, weights, valid, slots_total)
    if want_aux:
      for name, value in counts.usage_metrics(*sums).items():
        model_vars.report_mean(self, name, value)
    if want_sums:
      heads = counts.usage_counts(slots, weights, valid, slots_total, "head")
      named = dict(zip(("reads", "top1", "weights"), sums))
      named.update(reads_per_head=heads[0], top1_per_head=heads[1])
      for name, value in named.items():
        self.sow(
            USAGE_COLLECTION,
            name,
            value,
            init_fn=lambda n=value.shape[0]: jnp.zeros((n,), jnp.float32),
            reduce_fn=lambda a, b: a + b,
        )


class MemoryFeedForward(nn.Module):
  """``alpha FFN(x) + beta PKM(x)``: [B, T, D] -> [B, T, D].

  The FFN (module ``dense``) exists only when alpha != 0; the memory
  (``memory``) only when beta != 0. Its options (``options``,
  ``model.feed_forward_options``) are ``MemoryOptions``, each kind's
  defaults the default of its ``options`` field.
  """

  d_model: int
  d_ff: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  options: MemoryOptions = MemoryOptions()
  activation: str = "relu"  # the FFN's (model.activation)
  ffn_weight: float = 1.0
  memory_weight: float = 1.0

  @nn.compact
  def __call__(
      self,
      x: Array,
      *,
      deterministic: bool,
      mask: Optional[Array] = None,
      shared: Optional[Mapping[str, Array]] = None,
  ) -> Array:
    """[B, T, D] -> [B, T, D]; ``shared``: the model's shared parameters
    (``shared_params``: the values table when ``shared_values``)."""
    o = self.options
    values = None
    if o.shared_values:
      if not shared or "values" not in shared:
        raise errors.ConfigError(
            "model.feed_forward_options.shared_values needs a model family "
            "that creates shared parameters (decoder_lm, encoder)"
        )
      values = shared["values"]
    out = jnp.zeros_like(x)
    if self.ffn_weight:
      sizes = dict(
          d_model=self.d_model,
          d_ff=self.d_ff,
          dtype=self.dtype,
          dropout_rate=self.dropout_rate,
          activation=self.activation,
      )
      if o.base == "glu":  # A pretrained Llama's (SwiGLU) FFN.
        dense = feed_forward.GatedFeedForward(**sizes, name="dense")
      else:
        ffn = feed_forward.FeedForwardOptions(o.activation_dropout)
        dense = feed_forward.FeedForward(**sizes, options=ffn, name="dense")
      f = dense(x, deterministic=deterministic)
      out = out + self.ffn_weight * f
    if self.memory_weight:
      m = ProductKeyMemory(
          d_model=self.d_model, dtype=self.dtype, options=o, name="memory"
      )(x, deterministic=deterministic, mask=mask, values=values)
      if o.gate:
        m = self._gate(x, m)
      out = out + self.memory_weight * m.astype(out.dtype)
    return out

  def _gate(self, x: Array, m: Array) -> Array:
    """Memory+'s gate ``(m ⊙ silu(x W1)) W2``: [B, T, D] -> [B, T, D]."""
    dense = lambda axes, name: nn.Dense(
        self.d_model,
        dtype=self.dtype,
        name=name,
        kernel_init=nn.with_logical_partitioning(
            nn.initializers.xavier_uniform(), axes
        ),
        bias_init=nn.with_logical_partitioning(
            nn.initializers.zeros, (axes[1],)
        ),
    )
    g = nn.silu(dense(("embed", "mlp"), "gate_in")(x))
    return dense(("mlp", "embed"), "gate_out")(m.astype(g.dtype) * g)


class PKMFeedForward(MemoryFeedForward):
  """The memory in place of the FFN ('pkm': alpha = 0, beta = 1)."""

  ffn_weight: float = 0.0
  memory_weight: float = 1.0


class MemoryPlusFeedForward(MemoryFeedForward):
  """Memory+ (Berges et al. 2025) in place of the FFN ('memory_plus'):
  ``(PKM(x) ⊙ silu(x W1)) W2`` with qk-norm (its options' defaults)."""

  options: MemoryOptions = MemoryOptions(qk_norm=True, gate=True)
  ffn_weight: float = 0.0
  memory_weight: float = 1.0


class ResMFeedForward(MemoryFeedForward):
  """Residual memory ('resm': FFN + PKM, alpha = beta = 1)."""

  ffn_weight: float = 1.0
  memory_weight: float = 1.0


def check_model(model: settings_lib.Model) -> None:
  """Raises ConfigError for memory options that cannot work (before any
  run)."""
  names = {f.name for f in dataclasses.fields(MemoryOptions)}
  given = dict(model.feed_forward_options or {})
  o = MemoryOptions(**{k: v for k, v in given.items() if k in names})
  where = "model.feed_forward_options"
  num_keys, topk, k_dim = int(o.num_keys), int(o.topk), int(o.k_dim)
  norm, read, heads = o.query_norm, o.read, int(o.heads)
  if topk < 1 or topk > num_keys:
    raise errors.ConfigError(
        f"{where}.topk {topk} must be between 1 and num_keys {num_keys} "
        "(the sub-keys each half chooses from)"
    )
  if k_dim < 2 or k_dim % 2:
    raise errors.ConfigError(f"{where}.k_dim {k_dim} must be even and >= 2")
  if norm not in QUERY_NORMS:
    raise errors.ConfigError(
        f"{where}.query_norm must be one of {QUERY_NORMS}, got {norm!r}"
    )
  if read not in READS:
    raise errors.ConfigError(
        f"{where}.read must be one of {READS}, got {read!r}"
    )
  group = int(o.read_group)
  if group < 0 or (group and (heads * topk) % group):
    raise errors.ConfigError(
        f"{where}.read_group {group} must divide heads * topk = "
        f"{heads * topk} (or be 0 for the default)"
    )
  leak = bool(o.allow_batchnorm_future_leak)
  if norm == "batch" and model.family in CAUSAL_FAMILIES and not leak:
    raise errors.ConfigError(
        f"{where}.query_norm='batch' in the causal model.family "
        f"{model.family!r} lets each position see later ones through the "
        f"batch statistics: set {where}.{LEAK_SWITCH}=True to train it "
        "anyway (its perplexity is then no causal score), or use 'layer'"
    )


def _kind(module: type[nn.Module]) -> extend.FeedForward:
  """A memory feed-forward kind: given the padding mask; its query
  BatchNorm's running mean and variance ('batch_stats') carried by the
  train state; the leak switch and the read options change no weight (not
  in the signature)."""
  return extend.FeedForward(
      module,
      takes_mask=True,
      state_collections=("batch_stats",),
      runtime_options=(LEAK_SWITCH,) + READ_OPTIONS,
      takes_activation=True,
      check=check_model,
      shared_params=shared_params,
  )


PKM = _kind(PKMFeedForward)
RESM = _kind(ResMFeedForward)
MEMORY_PLUS = _kind(MemoryPlusFeedForward)
