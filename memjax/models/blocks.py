"""The residual block every model family builds on, and the pieces they share
(the normalisation kinds among them).

One ``ResidualBlock`` serves the decoder LM (``transformer.TransformerLM``),
the translation encoder and decoder (``seq2seq.EncoderDecoder``), the
BERT-style encoder (``encoder.Encoder``) and any LM with cross-attention
layers (MARGE). A block runs up to three residual sub-layers, in order:

1. ``attention``: self-attention, with a state (the decoder LM's recurrent
   memory, the translation decoder's key/value cache);
2. ``cross_attention`` (optional): over something outside the sequence
   (the encoder output, retrieved sources);
3. ``ffn``: a feed-forward kind, given the padding mask when it takes one
   (product-key memory).

Each sub-layer is ``x + Drop(f(LN(x)))`` (``norm_position='pre'``) or
``LN(x + Drop(f(x)))`` (``'post'``), with its norm (``make_norm``) ``ln_attn``,
``ln_cross`` or ``ln_ffn`` and one residual dropout (``Dropout_0``) for
all three. With ``post_norms`` each sub-layer's output is normalised
too before it is added (``x + Drop(LN'(f(LN(x))))``: Gemma 2 and 3's four
norms a block), by ``ln_attn_post`` and ``ln_ffn_post``. Flax derives
the parameter paths (``layer_0/ln_attn/scale``),
the initial weights and the dropout streams from these names. Besides its
output the block returns g, the feed-forward sub-layer's input as that
sub-layer sees it (``LN_ffn(h)`` pre, ``h`` post): TRIME's memory key.

Attention sub-layers share one calling convention::

    layer(x [B, T, D], state, *, deterministic, **inputs)
        -> (y [B, T, D], new_state)

A cross-attention gets its keys and values or its sources through
``inputs`` and takes and returns the state None.

The families build their blocks through their base,
``block_stack.BlockStack``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors
from memjax import extend

Array = jax.Array

# Where a block's LayerNorms sit (``ResidualBlock``).
NormPosition = Literal["pre", "post"]
NORM_POSITIONS = ("pre", "post")
# Dtypes by name: ``model.dtype`` (compute) and ``model.param_dtype``.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(name: str, key: str = "model.dtype") -> Any:
  """The jnp dtype of ``model.dtype`` (or of the setting ``key``).

  Raises:
    errors.ConfigError: an unknown name.
  """
  if name not in DTYPES:
    raise errors.ConfigError(
        f"{key} must be one of {list(DTYPES)}, got {name!r}"
    )
  return DTYPES[name]


def check_norm_position(norm_position: str) -> None:
  """Raises ConfigError unless ``norm_position`` is 'pre' or 'post'."""
  if norm_position not in NORM_POSITIONS:
    raise errors.ConfigError(
        f"model.norm_position must be one of {NORM_POSITIONS}, got "
        f"{norm_position!r}"
    )


# The normalisation kinds of a block and of a model's last hidden states.
# ``model.family_options.norm`` picks one for every normalisation of a
# decoder LM: 'layer' (LayerNorm, scale and bias), 'rms' (RMSNorm, a scale
# only: ``x / sqrt(mean(x^2) + eps) * scale``, as Llama-family models have
# it) or 'rms_plus_one' (Gemma's RMSNorm: ``x / sqrt(mean(x^2) + eps) *
# (1 + scale)`` in float32, its scale starting at 0). The first two are
# Flax's own modules; each names its parameters ``scale`` (and ``bias``),
# with the logical axis 'embed' (or another one given, as 'kv' for a head's
# features).
NORMS = ("layer", "rms", "rms_plus_one")


def check_norm(kind: str) -> None:
  """Raises ConfigError unless ``kind`` is one of ``NORMS``."""
  if kind not in NORMS:
    raise errors.ConfigError(
        f"model.family_options.norm must be one of {', '.join(NORMS)}, got "
        f"{kind!r}"
    )


class RMSNormPlusOne(nn.Module):
  """Gemma's RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * (1 +
  scale)``, computed in float32 and cast to ``dtype`` (Hugging Face's
  ``Gemma3RMSNorm``), its ``scale`` [N] starting at 0.

  Attributes:
    epsilon: added to the mean square.
    dtype: the output's dtype.
    axis: the scale's logical axis.
  """

  epsilon: float = 1e-6
  dtype: Any = jnp.float32
  axis: str = "embed"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., N] -> [..., N] normalised."""
    init = nn.with_logical_partitioning(nn.initializers.zeros, (self.axis,))
    scale = self.param("scale", init, (x.shape[-1],), jnp.float32)
    x = x.astype(jnp.float32)
    y = x * jax.lax.rsqrt(
        jnp.mean(x * x, axis=-1, keepdims=True) + self.epsilon
    )
    return (y * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)


def layer_norm(
    name: Optional[str], dtype: Any, epsilon: float = 1e-6, axis: str = "embed"
) -> nn.LayerNorm:
  """A LayerNorm over [..., D] whose scale and bias have the logical axis
  ``axis``; ``name`` None leaves the name to the parent's ``setup``."""
  return nn.LayerNorm(
      epsilon=epsilon,
      dtype=dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, (axis,)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axis,)),
      **({} if name is None else {"name": name}),
  )


def make_norm(
    kind: str,
    name: Optional[str],
    dtype: Any,
    epsilon: float = 1e-6,
    axis: str = "embed",
) -> nn.Module:
  """The normalisation ``kind`` (``NORMS``) over the last axis of [..., N],
  its parameters of logical axis ``axis`` (the model's 'embed'; 'kv' for a
  head's features); ``name`` None leaves the name to the parent's
  ``setup``.

  Raises:
    errors.ConfigError: an unknown kind.
  """
  check_norm(kind)
  if kind == "layer":
    return layer_norm(name, dtype, epsilon, axis)
  if kind == "rms_plus_one":
    named = {} if name is None else {"name": name}
    return RMSNormPlusOne(epsilon=epsilon, dtype=dtype, axis=axis, **named)
  return nn.RMSNorm(
      epsilon=epsilon,
      dtype=dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, (axis,)),
      **({} if name is None else {"name": name}),
  )


@dataclasses.dataclass(frozen=True)
class Sublayer:
  """A sub-layer to build inside a block: a module class and its arguments.

  Attributes:
    module: the Flax module class.
    kwargs: its constructor arguments, all but ``name``.
    takes_mask, takes_shared: a feed-forward given the padding mask, the
      model's shared parameters (``extend.FeedForward.shared_params``).
  """

  module: type[nn.Module]
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  takes_mask: bool = False
  takes_shared: bool = False

  def build(self, name: str) -> nn.Module:
    """The module, named ``name``."""
    return self.module(**self.kwargs, name=name)


def make_sublayer(
    module: type[nn.Module],
    options: Optional[Mapping[str, Any]],
    where: str,
    *,
    takes_mask: bool = False,
    takes_shared: bool = False,
    **kwargs: Any,
) -> Sublayer:
  """``module`` with ``kwargs`` and the kind's own ``options``: its
  options object (``extend.make_options``), or, for a module of the older
  form (no ``options`` field), its own fields.

  Args:
    module: the kind's module class.
    options: its own attributes (a dict), or None.
    where: the config key of ``options`` and what the kind is, for
      messages ("model.attention_options of attention kind 'xl'").
    takes_mask, takes_shared: as ``Sublayer``'s.
    **kwargs: the attributes every kind of its sort takes.

  Raises:
    errors.ConfigError: an option the kind does not take.
  """
  if extend.kind_options(module) is not None:
    built = extend.make_options(module, options, where)
    return Sublayer(
        module, {**kwargs, "options": built}, takes_mask, takes_shared
    )
  options = dict(options or {})
  fields = {f.name for f in dataclasses.fields(module)} - {"parent", "name"}
  unknown = sorted(set(options) - (fields - set(kwargs)))
  if unknown:
    own = sorted(fields - set(kwargs))
    key, _, kind = where.partition(" of ")
    raise errors.ConfigError(
        f"{key} has {', '.join(unknown)}, which {kind} does not take; its "
        f"options: {', '.join(own) or 'none'}"
    )
  return Sublayer(module, {**kwargs, **options}, takes_mask, takes_shared)


class ResidualBlock(nn.Module):
  """Self-attention, an optional cross-attention and a feed-forward kind.

  See the module docstring.

  Attributes:
    attention: the self-attention sub-layer.
    feed_forward: the feed-forward sub-layer.
    cross: the cross-attention sub-layer, or None (no cross-attention).
    norm_position: 'pre' or 'post'.
    norm_kind: 'layer' or 'rms' (``NORMS``).
    norm_epsilon: the norms' epsilon.
    post_norms: normalise each sub-layer's output before adding it
      (``<norm>_post``).
    dropout_rate: residual dropout.
    dtype: compute dtype of the LayerNorms.
  """

  attention: Sublayer
  feed_forward: Sublayer
  cross: Optional[Sublayer] = None
  norm_position: NormPosition = "pre"
  norm_kind: str = "layer"
  norm_epsilon: float = 1e-6
  post_norms: bool = False
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  def setup(self):
    # The one sub-layer built here: a decoder reads its keys and values
    # outside a call (``cross_kv``). The others are built in __call__.
    if self.cross is not None:
      self.cross_attention = self.cross.build("cross_attention")

  def cross_kv(self, source: Array) -> Any:
    """The cross-attention's keys and values of ``source`` [B, S, D].

    For a cross-attention kind with a ``kv`` method (the attention core's,
    ``multihead.MultiHeadAttention.kv``: keys, values [B, S, H, d_h]), so a
    decoder computes them once per input.
    """
    return self.cross_attention.kv(source)

  @nn.compact
  def __call__(
      self,
      x: Array,
      state: Any = None,
      deterministic: bool = True,
      *,
      mask: Optional[Array] = None,
      attend_inputs: Optional[Mapping[str, Any]] = None,
      cross_inputs: Optional[Mapping[str, Any]] = None,
      ffn_shared: Optional[Mapping[str, Array]] = None,
  ) -> tuple[Array, Array, Any]:
    """Runs the block.

    Args:
      x: [B, T, D] the block's input.
      state: the self-attention's state (recurrent memory, key/value cache)
        or None.
      deterministic: disables dropout (static under ``nn.remat``: argument
        3, counting the module).
      mask: [B, T] bool, True = a real position, for a feed-forward kind
        that takes it; None = every position.
      attend_inputs: keyword inputs of the self-attention (e.g. its
        attention mask).
      cross_inputs: keyword inputs of the cross-attention (ignored without
        one).
      ffn_shared: the model's shared parameters (``shared_params``).

    Returns:
      ([B, T, D] output, [B, T, D] g, the self-attention's new state).
    """
    drop = nn.Dropout(self.dropout_rate)  # Named Dropout_0 by Flax.

    def residual(h, norm, f):
      """One sub-layer: (its output, f's state, f's input)."""
      ln = make_norm(self.norm_kind, norm, self.dtype, self.norm_epsilon)
      y = ln(h) if self.norm_position == "pre" else h
      out, f_state = f(y)
      if self.post_norms:
        out = make_norm(
            self.norm_kind, norm + "_post", self.dtype, self.norm_epsilon
        )(out)
      h = h + drop(out, deterministic=deterministic)
      return (h if self.norm_position == "pre" else ln(h)), f_state, y

    attend = self.attention.build("attention")
    h, new_state, _ = residual(
        x,
        "ln_attn",
        lambda y: attend(
            y, state, deterministic=deterministic, **(attend_inputs or {})
        ),
    )
    if self.cross is not None:
      h, _, _ = residual(
          h,
          "ln_cross",
          lambda y: self.cross_attention(
              y, None, deterministic=deterministic, **(cross_inputs or {})
          ),
      )
    h = nn.with_logical_constraint(h, ("batch", "length", "embed"))
    ffn = self.feed_forward.build("ffn")
    takes_mask = mask is not None and self.feed_forward.takes_mask
    extra = {"mask": mask} if takes_mask else {}
    if ffn_shared is not None and self.feed_forward.takes_shared:
      extra["shared"] = ffn_shared
    out, _, g = residual(
        h,
        "ln_ffn",
        lambda y: (ffn(y, deterministic=deterministic, **extra), None),
    )
    out = nn.with_logical_constraint(out, ("batch", "length", "embed"))
    return out, g, new_state
