"""The residual block every model family builds on, and the pieces they share.

One ``ResidualBlock`` serves the decoder LM (``transformer.TransformerLM``),
the translation encoder and decoder (``seq2seq.EncoderDecoder``), the
BERT-style encoder (``encoder.Encoder``) and any LM with cross-attention
layers. A block runs up to three residual sub-layers:

1. self-attention (``attend``), with a state: the decoder LM's recurrent
   memory or the translation decoder's key/value cache;
2. an optional cross-attention (``cross``) over something outside the
   sequence (the encoder output, retrieved sources);
3. a feed-forward kind (``feed_forward``), given the padding mask when its
   ``__call__`` takes ``mask`` (product-key memory).

Each sub-layer is ``x + Drop(f(LN(x)))`` (``norm_position='pre'``) or
``LN(x + Drop(f(x)))`` (``'post'``). Besides its output the block returns
g, the feed-forward sub-layer's input as that sub-layer sees it
(``LN_ffn(h)`` pre, ``h`` post): TRIME's memory key.

The sub-layers are given as ``Sublayer`` specs (a module class and its
constructor arguments) and built inside the block under the names of its
``names`` (a ``Names``), so each family keeps the parameter paths its
checkpoints were written with (``layer_0/ln_attn/scale``,
``decoder_0/self_attention/query``, ...). Attention sub-layers share one
calling convention::

    layer(x [B, T, D], state, *, deterministic, **inputs)
        -> (y [B, T, D], new_state)

A cross-attention gets its keys and values or its sources through
``inputs`` and takes and returns the state None.

``BlockStack`` is the base of the families: the settings they share (sizes,
dropouts, the feed-forward kind, LayerNorm placement), the model interface
``model(inputs, targets, memory, deterministic=..., **EXTRA_INPUTS)`` that
the train step and the evaluations call (each family implements
``forward``), and ``make_block``, which builds a block with the family's
settings.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import (
    Any,
    Callable,
    ClassVar,
    Literal,
    Mapping,
    NamedTuple,
    Optional,
)

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import registry
from memjax.models import feed_forward as feed_forward_lib

Array = jax.Array

# Where a block's LayerNorms sit (``ResidualBlock``).
NormPosition = Literal["pre", "post"]
NORM_POSITIONS = ("pre", "post")


def check_norm_position(norm_position: str) -> None:
  """Raises ConfigError unless ``norm_position`` is 'pre' or 'post'."""
  if norm_position not in NORM_POSITIONS:
    raise errors.ConfigError(
        f"model.norm_position must be one of {NORM_POSITIONS}, got "
        f"{norm_position!r}"
    )


def sinusoid_table(length: int, dim: int) -> np.ndarray:
  """[length, dim] sinusoidal absolute position table (Vaswani et al.)."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  inv = 1.0 / (10000 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  ang = pos * inv[None]
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2] = np.sin(ang)
  table[:, 1::2] = np.cos(ang)[:, : dim // 2]
  return table


def layer_norm(name: str, dtype: Any, epsilon: float = 1e-6) -> nn.LayerNorm:
  """A LayerNorm over [..., D] whose scale and bias have the 'embed' axis."""
  return nn.LayerNorm(
      epsilon=epsilon,
      dtype=dtype,
      name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
  )


@dataclasses.dataclass(frozen=True)
class Sublayer:
  """A sub-layer to build inside a block: a module class and its arguments.

  Attributes:
    module: the Flax module class.
    kwargs: its constructor arguments, all but ``name``.
  """

  module: type[nn.Module]
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def build(self, name: str) -> nn.Module:
    """The module, named ``name``."""
    return self.module(**self.kwargs, name=name)

  def takes(self, argument: str) -> bool:
    """Whether the module's ``__call__`` has a parameter ``argument``."""
    return argument in inspect.signature(self.module.__call__).parameters


def make_sublayer(
    reg: registry.Registry,
    kind: str,
    options: Optional[Mapping[str, Any]],
    options_key: str,
    **kwargs: Any,
) -> Sublayer:
  """The sub-layer registered as ``kind``, with ``kwargs`` and options.

  Args:
    reg: the registry (``registry.ATTENTION`` or ``FEED_FORWARD``).
    kind: the registered name.
    options: the kind's own attributes (a dict), or None.
    options_key: the config key of ``options``, for messages.
    **kwargs: the attributes every kind of ``reg`` takes.

  Raises:
    errors.ConfigError: an unknown kind, or an option the kind does not take.
  """
  cls = reg.get(kind)
  options = dict(options or {})
  fields = {f.name for f in dataclasses.fields(cls)} - {"parent", "name"}
  unknown = sorted(set(options) - (fields - set(kwargs)))
  if unknown:
    own = sorted(fields - set(kwargs))
    raise errors.ConfigError(
        f"{options_key} has {', '.join(unknown)}, which {reg.what} {kind!r} "
        f"does not take; its options: {', '.join(own) or 'none'}"
    )
  return Sublayer(cls, {**kwargs, **options})


class Names(NamedTuple):
  """The names of a block's sub-layers: its parameter paths.

  The defaults are the decoder LM's (and MARGE's); the translation model
  and the BERT-style encoder name some of theirs otherwise.
  """

  attention: str = "attention"
  ln_attention: str = "ln_attn"
  cross_attention: str = "cross_attention"
  ln_cross: str = "ln_cross"
  ffn: str = "ffn"
  ln_ffn: str = "ln_ffn"
  # No parameters; its name seeds the residual dropout's random stream.
  dropout: str = "Dropout_0"


class ResidualBlock(nn.Module):
  """Self-attention, an optional cross-attention and a feed-forward kind.

  See the module docstring. The fields are not named like the sub-layers,
  which are attributes of the block under ``names``.

  Attributes:
    attend: the self-attention sub-layer.
    feed_forward: the feed-forward sub-layer.
    cross: the cross-attention sub-layer, or None (no cross-attention).
    names: the sub-layers' names.
    norm_position: 'pre' or 'post'.
    norm_epsilon: the LayerNorms' epsilon.
    dropout_rate: residual dropout.
    dtype: compute dtype of the LayerNorms.
  """

  attend: Sublayer
  feed_forward: Sublayer
  cross: Optional[Sublayer] = None
  names: Names = Names()
  norm_position: NormPosition = "pre"
  norm_epsilon: float = 1e-6
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  def setup(self):
    n = self.names
    norms = [n.ln_attention, n.ln_ffn]
    layers = {
        n.attention: self.attend.build(n.attention),
        n.ffn: self.feed_forward.build(n.ffn),
        n.dropout: nn.Dropout(self.dropout_rate),
    }
    if self.cross is not None:
      layers[n.cross_attention] = self.cross.build(n.cross_attention)
      norms.append(n.ln_cross)
    for name in norms:
      layers[name] = layer_norm(name, self.dtype, self.norm_epsilon)
    for name, layer in layers.items():
      setattr(self, name, layer)

  def _residual(
      self,
      x: Array,
      norm: str,
      f: Callable[[Array], tuple[Array, Any]],
      deterministic: bool,
  ) -> tuple[Array, Any, Array]:
    """One residual sub-layer over x [B, T, D].

    Args:
      x: [B, T, D] the sub-layer's residual input.
      norm: the name of its LayerNorm.
      f: the sub-layer, [B, T, D] -> ([B, T, D], state).
      deterministic: disables dropout.

    Returns:
      ([B, T, D] output, f's state, [B, T, D] f's input).
    """
    pre = self.norm_position == "pre"
    ln = getattr(self, norm)
    y = ln(x) if pre else x
    out, state = f(y)
    drop = getattr(self, self.names.dropout)
    h = x + drop(out, deterministic=deterministic)
    return (h if pre else ln(h)), state, y

  def _attention(
      self,
      x: Array,
      name: str,
      norm: str,
      state: Any,
      inputs: Optional[Mapping[str, Any]],
      deterministic: bool,
  ) -> tuple[Array, Any]:
    """An attention sub-layer over x [B, T, D]: ([B, T, D], new state)."""
    layer = getattr(self, name)
    f = lambda y: layer(y, state, deterministic=deterministic, **(inputs or {}))
    return self._residual(x, norm, f, deterministic)[:2]

  def cross_kv(self, source: Array) -> Any:
    """The cross-attention's keys and values of ``source`` [B, S, D].

    For a cross-attention kind with a ``kv`` method (``seq2seq.Attention``:
    keys, values [B, S, H, d_h]), so a decoder computes them once per input.
    """
    return getattr(self, self.names.cross_attention).kv(source)

  def __call__(
      self,
      x: Array,
      state: Any = None,
      deterministic: bool = True,
      *,
      mask: Optional[Array] = None,
      attend_inputs: Optional[Mapping[str, Any]] = None,
      cross_inputs: Optional[Mapping[str, Any]] = None,
  ) -> tuple[Array, Array, Any]:
    """Runs the block.

    Args:
      x: [B, T, D] the block's input.
      state: the self-attention's state (recurrent memory, key/value cache)
        or None.
      deterministic: disables dropout (static under ``nn.remat``: argument
        3, counting the module).
      mask: [B, T] bool, True = a real position, for a feed-forward kind
        that takes ``mask``; None = every position.
      attend_inputs: keyword inputs of the self-attention (e.g. its
        attention mask).
      cross_inputs: keyword inputs of the cross-attention (ignored without
        one).

    Returns:
      ([B, T, D] output, [B, T, D] g, the self-attention's new state).
    """
    n = self.names
    h, new_state = self._attention(
        x, n.attention, n.ln_attention, state, attend_inputs, deterministic
    )
    if self.cross is not None:
      h, _ = self._attention(
          h, n.cross_attention, n.ln_cross, None, cross_inputs, deterministic
      )
    h = nn.with_logical_constraint(h, ("batch", "length", "embed"))
    extra = {}
    if mask is not None and self.feed_forward.takes("mask"):
      extra["mask"] = mask
    ffn = getattr(self, n.ffn)
    out, _, g = self._residual(
        h,
        n.ln_ffn,
        lambda y: (ffn(y, deterministic=deterministic, **extra), None),
        deterministic,
    )
    out = nn.with_logical_constraint(out, ("batch", "length", "embed"))
    return out, g, new_state


class BlockStack(nn.Module):
  """Base of the model families built of ``ResidualBlock`` stacks.

  The settings every family shares (the defaults are the decoder LM's), the
  interface of a model without recurrent memory (a family with one
  overrides ``carries_memory``, ``init_memory`` and ``reset_memory``), and
  the makers of its blocks' pieces.

  Attributes:
    vocab_size: V.
    num_layers: number of blocks (a translation model's decoder blocks).
    d_model: D.
    num_heads: H.
    head_dim: d_h (H * d_h need not equal D).
    dtype: compute dtype (float32 or bfloat16); parameters stay float32.
    d_ff: feed-forward width.
    feed_forward: feed-forward kind, a name in ``registry.FEED_FORWARD``.
    feed_forward_options: kind-specific feed-forward attributes (a dict).
    dropout_rate: residual, embedding and feed-forward dropout.
    attention_dropout_rate: dropout on attention probabilities.
    norm_position: 'pre' or 'post' (see ``ResidualBlock``).
    norm_epsilon: LayerNorm epsilon.
    max_len: longest input (position table).
    activation: the feed-forward's nonlinearity
      (``feed_forward.ACTIVATIONS``), for the kinds that take one.
  """

  vocab_size: int
  num_layers: int = 2
  d_model: int = 64
  num_heads: int = 2
  head_dim: int = 32
  dtype: Any = jnp.float32
  d_ff: int = 256
  feed_forward: str = "ffn"
  feed_forward_options: Optional[Mapping[str, Any]] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  norm_position: NormPosition = "pre"
  norm_epsilon: float = 1e-6
  max_len: int = 4096
  activation: str = "relu"

  # Batch arrays the train step passes as keyword arguments.
  EXTRA_INPUTS: ClassVar[tuple[str, ...]] = ()

  def carries_memory(self) -> bool:
    """Whether the model carries a recurrent memory across segments."""
    return False

  def init_memory(self, batch_size: int) -> Any:
    """An empty memory for ``batch_size`` lanes: None (no memory)."""
    del batch_size
    return None

  def reset_memory(self, memory: Any, reset: Array) -> Any:
    """The memory with the lanes where ``reset`` ([B] bool) is set emptied."""
    del memory, reset
    return None

  def __call__(
      self,
      inputs: Array,
      targets: Optional[Array] = None,
      memory: Any = None,
      *,
      deterministic: bool = True,
      **extra_inputs: Array,
  ) -> Any:
    """Scores a batch: the interface of the train step and the evaluations.

    Args:
      inputs: [B, T] int32 token ids.
      targets: the ids to score (the family's ``forward`` says which), or
        None: no scores.
      memory: the recurrent memory from the previous segment (see
        ``init_memory``), or None; only a family with a memory takes one.
      deterministic: disables dropout.
      **extra_inputs: the family's ``EXTRA_INPUTS`` (arrays of the batch).

    Returns:
      The family's output (``forward``'s).
    """
    if memory is not None:
      extra_inputs["memory"] = memory
    return self.forward(inputs, targets, deterministic, **extra_inputs)

  def forward(
      self, inputs: Array, targets: Optional[Array], deterministic: bool
  ) -> Any:
    """The family's scoring of a batch (see ``__call__``)."""
    raise TypeError(
        f"{type(self).__name__} defines no forward(): a family"
        " built on BlockStack scores its batches there"
    )

  def table(
      self,
      name: str,
      init: nn.initializers.Initializer,
      rows: int,
      axis: Optional[str] = "vocab",
  ) -> Array:
    """A [rows, D] parameter (a table of embeddings), axes (axis, 'embed')."""
    return self.param(
        name,
        nn.with_logical_partitioning(init, (axis, "embed")),
        (rows, self.d_model),
    )

  def norm(self, name: str) -> nn.LayerNorm:
    """A LayerNorm named ``name`` with the model's epsilon and dtype."""
    return layer_norm(name, self.dtype, self.norm_epsilon)

  def attention_settings(self) -> dict[str, Any]:
    """The arguments every attention sub-layer takes."""
    names = ("d_model", "num_heads", "head_dim", "dtype")
    return dict(
        {k: getattr(self, k) for k in names},
        dropout_rate=self.attention_dropout_rate,
    )

  def make_block(
      self,
      name: str,
      attend: Sublayer,
      feed_forward: tuple[str, Optional[Mapping[str, Any]]],
      *,
      cross: Optional[Sublayer] = None,
      names: Names = Names(),
      block_cls: Callable[..., ResidualBlock] = ResidualBlock,
  ) -> ResidualBlock:
    """A block with the model's LayerNorm settings, dropout and dtype.

    Args:
      name: the block's name (``layer_0``, ...).
      attend: its self-attention.
      feed_forward: its feed-forward kind and that kind's options.
      cross: its cross-attention, or None.
      names: its sub-layers' names.
      block_cls: ``ResidualBlock`` or a lifted version of it (``nn.remat``).

    Raises:
      errors.ConfigError: an unknown feed-forward kind, or an option it does
        not take.
    """
    kind, options = feed_forward
    ffn = make_sublayer(
        registry.FEED_FORWARD,
        kind,
        options,
        "model.feed_forward_options",
        d_model=self.d_model,
        d_ff=self.d_ff,
        dropout_rate=self.dropout_rate,
        dtype=self.dtype,
        **feed_forward_lib.activation_option(kind, self.activation),
    )
    shared = ("norm_position", "norm_epsilon", "dropout_rate", "dtype")
    return block_cls(
        attend=attend,
        feed_forward=ffn,
        cross=cross,
        names=names,
        name=name,
        **{k: getattr(self, k) for k in shared},
    )
