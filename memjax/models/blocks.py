"""The residual block every model family builds on, and the pieces they share.

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
``LN(x + Drop(f(x)))`` (``'post'``), with its norm (``norms``) ``ln_attn``,
``ln_cross`` or ``ln_ffn`` and one residual dropout (``Dropout_0``) for
all three. Flax derives the parameter paths (``layer_0/ln_attn/scale``),
the initial weights and the dropout streams from these names. Besides its
output the block returns g, the feed-forward sub-layer's input as that
sub-layer sees it (``LN_ffn(h)`` pre, ``h`` post): TRIME's memory key.

Attention sub-layers share one calling convention::

    layer(x [B, T, D], state, *, deterministic, **inputs)
        -> (y [B, T, D], new_state)

A cross-attention gets its keys and values or its sources through
``inputs`` and takes and returns the state None.

``BlockStack`` is the base of the families: the settings they share (sizes,
dropouts, the feed-forward kind, LayerNorm placement), the model interface
``model(inputs, targets, memory, deterministic=..., **extra_inputs)`` that
the train step and the evaluations call (each family implements
``forward``; its ``extend.Family`` names the extra inputs), and
``make_block``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors
from memjax import extend
from memjax.models import feed_forward as feed_forward_lib
from memjax.models import norms
from memjax.models import stack

Array = jax.Array

# Where a block's LayerNorms sit (``ResidualBlock``).
NormPosition = Literal["pre", "post"]
NORM_POSITIONS = ("pre", "post")
# Compute dtypes by name (``model.dtype``); parameters stay float32.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(name: str) -> Any:
  """The jnp dtype of ``model.dtype``.

  Raises:
    errors.ConfigError: an unknown name.
  """
  if name not in DTYPES:
    raise errors.ConfigError(
        f"model.dtype must be one of {list(DTYPES)}, got {name!r}"
    )
  return DTYPES[name]


def check_norm_position(norm_position: str) -> None:
  """Raises ConfigError unless ``norm_position`` is 'pre' or 'post'."""
  if norm_position not in NORM_POSITIONS:
    raise errors.ConfigError(
        f"model.norm_position must be one of {NORM_POSITIONS}, got "
        f"{norm_position!r}"
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
  """``module`` with ``kwargs`` and the kind's own ``options``.

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
    norm_kind: 'layer' or 'rms' (``norms.NORMS``).
    norm_epsilon: the norms' epsilon.
    dropout_rate: residual dropout.
    dtype: compute dtype of the LayerNorms.
  """

  attention: Sublayer
  feed_forward: Sublayer
  cross: Optional[Sublayer] = None
  norm_position: NormPosition = "pre"
  norm_kind: str = "layer"
  norm_epsilon: float = 1e-6
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  def setup(self):
    # The one sub-layer built here: a decoder reads its keys and values
    # outside a call (``cross_kv``). The others are built in __call__.
    if self.cross is not None:
      self.cross_attention = self.cross.build("cross_attention")

  def cross_kv(self, source: Array) -> Any:
    """The cross-attention's keys and values of ``source`` [B, S, D].

    For a cross-attention kind with a ``kv`` method (``seq2seq.Attention``:
    keys, values [B, S, H, d_h]), so a decoder computes them once per input.
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
      ln = norms.make_norm(self.norm_kind, norm, self.dtype, self.norm_epsilon)
      y = ln(h) if self.norm_position == "pre" else h
      out, f_state = f(y)
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
    feed_forward: the feed-forward kind of ``feed_forward_layers``.
    feed_forward_options: its own attributes (a dict).
    feed_forward_layers: 1-based numbers of the layers of that kind; the
      others use ``feed_forward_base`` with the options it takes. () =
      every layer.
    feed_forward_base: the other layers' kind (``feed_forward_options.base``).
    kind_name: ``model.feed_forward``, for messages.
    dropout_rate: residual, embedding and feed-forward dropout.
    attention_dropout_rate: dropout on attention probabilities.
    norm_position: 'pre' or 'post' (see ``ResidualBlock``).
    norm_kind: 'layer' (LayerNorm) or 'rms' (RMSNorm), every norm's.
    norm_epsilon: the norms' epsilon.
    max_len: longest input (position table).
    activation: the feed-forward's nonlinearity
      (``feed_forward.ACTIVATIONS``), for the kinds that take one.
    remat: rematerialise each block in the backward pass.
    remat_policy: what a rematerialised block keeps
      (``stack.REMAT_POLICIES``).
    scan_layers: scan runs of identical layers (``memjax.models.stack``).
  """

  vocab_size: int
  num_layers: int = 2
  d_model: int = 64
  num_heads: int = 2
  head_dim: int = 32
  dtype: Any = jnp.float32
  d_ff: int = 256
  feed_forward: extend.FeedForward = feed_forward_lib.PLAIN
  feed_forward_options: Optional[Mapping[str, Any]] = None
  feed_forward_layers: Sequence[int] = ()
  feed_forward_base: extend.FeedForward = feed_forward_lib.PLAIN
  kind_name: str = "ffn"
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  norm_position: NormPosition = "pre"
  norm_kind: str = "layer"
  norm_epsilon: float = 1e-6
  max_len: int = 4096
  activation: str = "relu"
  remat: bool = False
  remat_policy: str = "full"
  scan_layers: bool = False

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
      **extra_inputs: the arrays of the batch the family takes besides
        (``extend.Family.extra_inputs``).

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

  def norm(self, name: str) -> nn.Module:
    """A norm named ``name`` of the model's kind, epsilon and dtype."""
    return norms.make_norm(self.norm_kind, name, self.dtype, self.norm_epsilon)

  def attention_settings(self) -> dict[str, Any]:
    """The arguments every attention sub-layer takes."""
    names = ("d_model", "num_heads", "head_dim", "dtype")
    return dict(
        {k: getattr(self, k) for k in names},
        dropout_rate=self.attention_dropout_rate,
    )

  def feed_forward_sublayer(self, layer: int) -> Sublayer:
    """The feed-forward of the 0-based ``layer``: the model's kind at its
    ``feed_forward_layers``, else the plain one with the options it takes.

    Raises:
      errors.ConfigError: an option the kind does not take, or an
        activation it has none of.
    """
    chosen = set(self.feed_forward_layers or range(1, self.num_layers + 1))
    kind, name = self.feed_forward, self.kind_name
    options = dict(self.feed_forward_options or {})
    fields = lambda k: {f.name for f in dataclasses.fields(k.module)}
    if layer + 1 not in chosen:
      kind, name = self.feed_forward_base, "ffn"
      options = {k: v for k, v in options.items() if k in fields(kind)}
    elif "base" not in fields(kind):  # The engine's option, not the kind's.
      options.pop("base", None)
    return make_sublayer(
        kind.module,
        options,
        f"model.feed_forward_options of feed-forward kind {name!r}",
        takes_mask=kind.takes_mask,
        takes_shared=kind.shared_params is not None,
        d_model=self.d_model,
        d_ff=self.d_ff,
        dropout_rate=self.dropout_rate,
        dtype=self.dtype,
        **feed_forward_lib.activation_option(kind, name, self.activation),
    )

  def shared_params(self) -> Optional[nn.Module]:
    """The feed-forward kind's shared parameters (``ffn_shared``) or None:
    built in ``setup``, its output given to the blocks as ``ffn_shared``."""
    declare = self.feed_forward.shared_params or (lambda *_: None)
    specs = declare(dict(self.feed_forward_options or {}), self.d_model)
    make = feed_forward_lib.SharedParams
    return make(dict(specs), name="ffn_shared") if specs else None

  def block_class(self) -> Callable[..., ResidualBlock]:
    """``ResidualBlock``, rematerialised with ``remat_policy`` if ``remat``
    (``deterministic``, argument 3 counting the module, is static)."""
    if not self.remat:
      return ResidualBlock
    return nn.remat(
        ResidualBlock,
        static_argnums=(3,),
        policy=stack.remat_policy(self.remat_policy),
    )

  def make_block(
      self,
      name: str,
      layer: int,
      attention: Sublayer,
      *,
      cross: Optional[Sublayer] = None,
  ) -> ResidualBlock:
    """Block ``layer`` (0-based) with the model's LayerNorm settings,
    dropout, dtype and feed-forward (``feed_forward_sublayer``), of
    ``block_class``.

    Args:
      name: the block's name (``layer_0``, ...).
      layer: its index, which picks its feed-forward.
      attention: its self-attention.
      cross: its cross-attention, or None.
    """
    shared = ("norm_position", "norm_kind", "norm_epsilon", "dropout_rate")
    return self.block_class()(
        attention=attention,
        feed_forward=self.feed_forward_sublayer(layer),
        cross=cross,
        name=name,
        dtype=self.dtype,
        **{k: getattr(self, k) for k in shared},
    )

  def stack_runs(
      self,
      prefix: str,
      layers: int,
      cross: Optional[Callable[[int], Optional[Sublayer]]] = None,
      breaks: Sequence[int] = (),
  ) -> list[stack.Run]:
    """The runs (``stack.runs``: of identical layers when ``scan_layers``,
    else one per layer) of ``layers`` blocks named ``prefix_<i>``, with
    the cross-attention ``cross(i)`` (or none) and runs starting at
    ``breaks``. Works on an unbound module."""
    keys = [
        (self.feed_forward_sublayer(i), cross(i) if cross else None)
        for i in range(layers)
    ]
    return stack.runs(prefix, keys, self.scan_layers, breaks)

  def layer_runs(self) -> list[stack.Run]:
    """The runs of every stack of the model (``scan_layers`` lays out its
    parameters by them); works on an unbound module."""
    return self.stack_runs("layer", self.num_layers)

  def make_stack(
      self,
      runs: Sequence[stack.Run],
      attention: Sublayer,
      cross: Optional[Callable[[int], Optional[Sublayer]]] = None,
  ) -> list[tuple[stack.Run, ResidualBlock]]:
    """(run, its block) of each run (``make_block``)."""
    return [
        (r, self.make_block(r.name, r.first, attention,
                            cross=cross(r.first) if cross else None))
        for r in runs
    ]  # fmt: skip
