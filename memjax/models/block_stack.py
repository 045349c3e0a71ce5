"""The base of the model families: ``BlockStack``.

The settings the families share (sizes, dropouts, the feed-forward kind,
LayerNorm placement), the model interface ``model(inputs, targets, memory,
deterministic=..., **extra_inputs)`` that the train step and the
evaluations call (each family implements ``forward``; its
``extend.Family`` names the extra inputs), and the blocks it builds
(``make_block``: ``blocks.ResidualBlock`` with the family's attention and
feed-forward sub-layers).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import extend
from memjax.models import attention as attention_lib
from memjax.models import blocks
from memjax.models import feed_forward as feed_forward_lib
from memjax.models import multihead
from memjax.models import norms
from memjax.models import stack

Array = jax.Array


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
    attention: the attention kind (an ``attention.AttentionKind`` class).
    attention_options: its own attributes (a dict).
    attention_name: ``model.attention``, for messages.
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
  norm_position: blocks.NormPosition = "pre"
  norm_kind: str = "layer"
  norm_epsilon: float = 1e-6
  max_len: int = 4096
  activation: str = "relu"
  remat: bool = False
  remat_policy: str = "full"
  scan_layers: bool = False
  attention: type[attention_lib.AttentionKind] = (
      attention_lib.CausalSelfAttention
  )
  attention_options: Optional[Mapping[str, Any]] = None
  attention_name: str = "vanilla"

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

  def plain_attention(
      self, options: Optional[Mapping[str, Any]] = None
  ) -> blocks.Sublayer:
    """The attention core as a sub-layer of the encoders and the
    translation model, with the 'vanilla' kind's ``options``: a padding or
    causal mask given as ``mask``, a cross-attention's keys and values as
    ``kv``."""
    return blocks.Sublayer(
        multihead.MultiHeadAttention,
        dict(
            self.attention_settings(),
            dropout_name="drop",
            **attention_lib.core_options(options),
        ),
    )

  def masked_attention(self, causal: bool = False) -> blocks.Sublayer:
    """The self-attention of a family that gives its own mask (``mask``):
    the 'vanilla' kind as the attention core with its options, another kind
    built with ``causal`` (False: both ways, an encoder's;
    ``attention.reads_whole_sequences``)."""
    if self.attention is attention_lib.CausalSelfAttention:
      return self.plain_attention(self.attention_options)
    return blocks.make_sublayer(
        self.attention,
        self.attention_options,
        f"model.attention_options of attention kind {self.attention_name!r}",
        causal=causal,
        **self.attention_settings(),
    )

  def feed_forward_sublayer(self, layer: int) -> blocks.Sublayer:
    """The feed-forward of the 0-based ``layer``: the model's kind at its
    ``feed_forward_layers``, else the plain one with the options it takes.

    Raises:
      errors.ConfigError: an option the kind does not take, or an
        activation it has none of.
    """
    chosen = set(self.feed_forward_layers or range(1, self.num_layers + 1))
    kind, name = self.feed_forward, self.kind_name
    options = dict(self.feed_forward_options or {})
    fields = lambda k: set(
        {f.name: 0 for f in dataclasses.fields(k.module)}
        if extend.kind_options(k.module) is None
        else extend.option_defaults(k.module)
    )
    if layer + 1 not in chosen:
      kind, name = self.feed_forward_base, "ffn"
      options = {k: v for k, v in options.items() if k in fields(kind)}
    elif "base" not in fields(kind):  # The engine's option, not the kind's.
      options.pop("base", None)
    return blocks.make_sublayer(
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

  def block_class(self) -> Callable[..., blocks.ResidualBlock]:
    """``ResidualBlock``, rematerialised with ``remat_policy`` if ``remat``
    (``deterministic``, argument 3 counting the module, is static)."""
    if not self.remat:
      return blocks.ResidualBlock
    return nn.remat(
        blocks.ResidualBlock,
        static_argnums=(3,),
        policy=stack.remat_policy(self.remat_policy),
    )

  def make_block(
      self,
      name: str,
      layer: int,
      attention: blocks.Sublayer,
      *,
      cross: Optional[blocks.Sublayer] = None,
  ) -> blocks.ResidualBlock:
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
      cross: Optional[Callable[[int], Optional[blocks.Sublayer]]] = None,
      breaks: Sequence[int] = (),
  ) -> list[stack.LayerRun]:
    """The runs (``stack.runs``: of identical layers when ``scan_layers``,
    else one per layer) of ``layers`` blocks named ``prefix_<i>``, with
    the cross-attention ``cross(i)`` (or none) and runs starting at
    ``breaks``. Works on an unbound module."""
    keys = [
        (self.feed_forward_sublayer(i), cross(i) if cross else None)
        for i in range(layers)
    ]
    return stack.runs(prefix, keys, self.scan_layers, breaks)

  def layer_runs(self) -> list[stack.LayerRun]:
    """The runs of every stack of the model (``scan_layers`` lays out its
    parameters by them); works on an unbound module."""
    return self.stack_runs("layer", self.num_layers)

  def make_stack(
      self,
      runs: Sequence[stack.LayerRun],
      attention: blocks.Sublayer,
      cross: Optional[Callable[[int], Optional[blocks.Sublayer]]] = None,
  ) -> list[tuple[stack.LayerRun, blocks.ResidualBlock]]:
    """(run, its block) of each run (``make_block``)."""
    return [
        (
            r,
            self.make_block(
                r.name,
                r.first,
                attention,
                cross=cross(r.first) if cross else None,
            ),
        )
        for r in runs
    ]
