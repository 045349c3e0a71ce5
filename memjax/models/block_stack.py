"""The base of the model families, ``BlockStack``, and the settings they
take whole, ``ModelConfig``.

As flax ``examples/lm1b``'s modules take one frozen ``TransformerConfig``,
every model family (``BlockStack`` and its subclasses) takes one attribute
``cfg``: the model's settings (``settings.Model``, the keys of
``config.model`` under their names) with what they name resolved once, by
``ModelConfig.of``: the attention and feed-forward kinds looked up in the
run's parts and the vocabulary size. A family reads ``cfg.dropout``,
``cfg.d_model``, ``cfg.attention_kind``; its own options
(``model.family_options``) stay attributes of its module. A
``ModelConfig`` is frozen and hashable (its option dicts are frozen), so it
is a fine Flax module attribute; it holds no mesh and no ConfigDict.

``BlockStack`` holds what the families share: the model interface
``model(inputs, targets, memory, deterministic=..., **extra_inputs)`` that
the train step and the evaluations call (each family implements
``forward``; its ``extend.Family`` names the extra inputs), and the blocks
it builds (``make_block``: ``blocks.ResidualBlock`` with the family's
attention and feed-forward sub-layers). ``sinusoid_table`` is the families'
absolute positions (Vaswani et al.).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import flax
import flax.linen as nn
import jax
import numpy as np

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.models import attention as attention_lib
from memjax.models import blocks
from memjax.models import feed_forward as feed_forward_lib
from memjax.models import multihead
from memjax.models import stack

Array = jax.Array


def sinusoid_table(length: int, dim: int) -> np.ndarray:
  """[length, dim] sinusoidal absolute position table (Vaswani et al.)."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  inv = 1.0 / (10000 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  ang = pos * inv[None]
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2] = np.sin(ang)
  table[:, 1::2] = np.cos(ang)[:, : dim // 2]
  return table


def _frozen(value: Any) -> Any:
  """``value`` with its dicts frozen and its lists made tuples (hashable)."""
  if isinstance(value, (dict, flax.core.FrozenDict)):
    return flax.core.FrozenDict({k: _frozen(v) for k, v in value.items()})
  if isinstance(value, list):
    return tuple(_frozen(v) for v in value)
  return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(settings_lib.Model):
  """``settings.Model`` with what its names resolve to: a family's ``cfg``.

  Attributes (besides ``settings.Model``'s, under their names: the sizes,
  ``dropout``, ``attention_dropout``, ``feed_forward_options``,
  ``feed_forward_layers``, ``norm_position``, ``norm_epsilon``, ``mem_len``,
  ``dtype`` (the compute dtype's name), ...):
    vocab_size: V.
    attention_kind: the ``attention.AttentionKind`` class that
      ``attention`` names.
    feed_forward_kind: the ``extend.FeedForward`` that ``feed_forward``
      names, of the ``feed_forward_layers``.
    feed_forward_base: the other layers' kind (``feed_forward_options.base``,
      default 'ffn').
  """

  vocab_size: int = 0
  attention_kind: type[attention_lib.AttentionKind] = (
      attention_lib.CausalSelfAttention
  )
  feed_forward_kind: extend.FeedForward = feed_forward_lib.PLAIN
  feed_forward_base: extend.FeedForward = feed_forward_lib.PLAIN

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, (dict, list)):
        object.__setattr__(self, field.name, _frozen(value))

  @property
  def compute_dtype(self) -> Any:
    """The jnp dtype of ``dtype`` (the parameters' is ``param_dtype``)."""
    return blocks.compute_dtype(self.dtype)

  @property
  def weight_dtype(self) -> Any:
    """The jnp dtype the parameters are kept in (``param_dtype``)."""
    return blocks.compute_dtype(self.param_dtype, "model.param_dtype")

  def replace(self, **changes: Any) -> ModelConfig:
    """A copy with ``changes`` (``cfg.replace(mem_len=128)``)."""
    return dataclasses.replace(self, **changes)

  @classmethod
  def of(
      cls, model: settings_lib.Model, *, vocab_size: int, parts: extend.Parts
  ) -> ModelConfig:
    """The config of a model's settings (``config.model``), with its
    attention and feed-forward kinds looked up in ``parts``.

    Raises:
      errors.ConfigError: an unknown attention or feed-forward kind or
        dtype, or feed-forward layers out of range.
    """
    for n in model.feed_forward_layers:
      if not isinstance(n, int) or not 1 <= n <= model.num_layers:
        raise errors.ConfigError(
            f"model.feed_forward_layers has {n!r}: layer numbers count from "
            f"1 to model.num_layers {model.num_layers}"
        )
    blocks.compute_dtype(model.dtype)
    options = dict(model.feed_forward_options or {})
    names = [f.name for f in dataclasses.fields(settings_lib.Model)]
    own = {k: getattr(model, k) for k in names}
    return cls(
        **own,
        vocab_size=vocab_size,
        attention_kind=parts.attention.get(model.attention),
        feed_forward_kind=parts.feed_forward.get(model.feed_forward),
        feed_forward_base=parts.feed_forward.get(
            str(options.get("base", "ffn"))
        ),
    )


class BlockStack(nn.Module):
  """Base of the model families built of ``ResidualBlock`` stacks.

  The settings every family shares (``cfg``), the
  interface of a model without recurrent memory (a family with one
  overrides ``carries_memory``, ``init_memory`` and ``reset_memory``), and
  the makers of its blocks' pieces.

  Attributes:
    cfg: the model's settings (``ModelConfig``: the sizes,
      dropouts, attention and feed-forward kinds and their options,
      LayerNorm placement, ``max_len``, remat and scan settings, the
      vocabulary size and the compute dtype).
    norm_kind: 'layer' (LayerNorm), 'rms' (RMSNorm) or 'rms_plus_one'
      (``blocks.NORMS``), every norm's (a family option).
    post_norms: each block also normalises its sub-layers' outputs
      (``blocks.ResidualBlock``; a family option).
    local_layers: 1-based layers (negative: counted from the end, -1 the
      last) whose self-attention takes ``local_attention_options`` over
      ``cfg.attention_options`` (a family option): Gemma 3's local
      layers, with their own sliding window and rotary base.
    local_attention_options: those layers' attention options that differ.
  """

  cfg: ModelConfig
  norm_kind: str = "layer"
  post_norms: bool = False
  local_layers: Sequence[int] = ()
  local_attention_options: Optional[Mapping[str, Any]] = None

  def with_settings(self, **changes: Any) -> "BlockStack":
    """An unbound copy whose ``cfg`` has ``changes`` (``mem_len=128``)."""
    return self.clone(cfg=self.cfg.replace(**changes))

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
        (rows, self.cfg.d_model),
    )

  def norm(self, name: str) -> nn.Module:
    """A norm named ``name`` of the model's kind, epsilon and dtype."""
    return blocks.make_norm(
        self.norm_kind, name, self.cfg.compute_dtype, self.cfg.norm_epsilon
    )

  def attention_settings(self) -> dict[str, Any]:
    """The arguments every attention sub-layer takes."""
    cfg = self.cfg
    return dict(
        d_model=cfg.d_model,
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        dtype=cfg.compute_dtype,
        dropout_rate=cfg.attention_dropout,
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
    if self.cfg.attention_kind is attention_lib.CausalSelfAttention:
      return self.plain_attention(self.cfg.attention_options)
    return blocks.make_sublayer(
        self.cfg.attention_kind,
        self.cfg.attention_options,
        f"model.attention_options of attention kind {self.cfg.attention!r}",
        causal=causal,
        **self.attention_settings(),
    )

  def local_layer_indices(self) -> frozenset[int]:
    """The 0-based layers of ``local_layers``.

    Raises:
      errors.ConfigError: a layer outside the stack.
    """
    n = self.cfg.num_layers
    bad = [i for i in self.local_layers if not (-n <= i <= n and i)]
    if bad:
      raise errors.ConfigError(
          f"model.family_options.local_layers {bad} must lie in 1..{n} or "
          f"-{n}..-1"
      )
    return frozenset(i - 1 if i > 0 else n + i for i in self.local_layers)

  def attention_options_at(self, layer: int) -> dict[str, Any]:
    """The self-attention options of the 0-based ``layer``: the model's,
    updated by ``local_attention_options`` at a local layer."""
    options = dict(self.cfg.attention_options or {})
    if layer in self.local_layer_indices():
      options.update(self.local_attention_options or {})
    return options

  def feed_forward_sublayer(self, layer: int) -> blocks.Sublayer:
    """The feed-forward of the 0-based ``layer``: the model's kind at its
    ``feed_forward_layers``, else the plain one with the options it takes.

    Raises:
      errors.ConfigError: an option the kind does not take, or an
        activation it has none of.
    """
    chosen = set(
        self.cfg.feed_forward_layers or range(1, self.cfg.num_layers + 1)
    )
    kind, name = self.cfg.feed_forward_kind, self.cfg.feed_forward
    options = dict(self.cfg.feed_forward_options or {})
    fields = lambda k: set(
        {f.name: 0 for f in dataclasses.fields(k.module)}
        if extend.kind_options(k.module) is None
        else extend.option_defaults(k.module)
    )
    if layer + 1 not in chosen:
      kind, name = self.cfg.feed_forward_base, "ffn"
      options = {k: v for k, v in options.items() if k in fields(kind)}
    elif "base" not in fields(kind):  # The engine's option, not the kind's.
      options.pop("base", None)
    return blocks.make_sublayer(
        kind.module,
        options,
        f"model.feed_forward_options of feed-forward kind {name!r}",
        takes_mask=kind.takes_mask,
        takes_shared=kind.shared_params is not None,
        d_model=self.cfg.d_model,
        d_ff=self.cfg.d_ff,
        dropout_rate=self.cfg.dropout,
        dtype=self.cfg.compute_dtype,
        **feed_forward_lib.activation_option(kind, name, self.cfg.activation),
    )

  def shared_params(self) -> Optional[nn.Module]:
    """The feed-forward kind's shared parameters (``ffn_shared``) or None:
    built in ``setup``, its output given to the blocks as ``ffn_shared``."""
    declare = self.cfg.feed_forward_kind.shared_params or (lambda *_: None)
    specs = declare(dict(self.cfg.feed_forward_options or {}), self.cfg.d_model)
    make = feed_forward_lib.SharedParams
    return make(dict(specs), name="ffn_shared") if specs else None

  def block_class(self) -> Callable[..., blocks.ResidualBlock]:
    """``ResidualBlock``, rematerialised with ``remat_policy`` if ``remat``
    (``deterministic``, argument 3 counting the module, is static)."""
    if not self.cfg.remat:
      return blocks.ResidualBlock
    return nn.remat(
        blocks.ResidualBlock,
        static_argnums=(3,),
        policy=stack.remat_policy(self.cfg.remat_policy),
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
    return self.block_class()(
        attention=attention,
        feed_forward=self.feed_forward_sublayer(layer),
        cross=cross,
        name=name,
        dtype=self.cfg.compute_dtype,
        norm_position=self.cfg.norm_position,
        norm_kind=self.norm_kind,
        norm_epsilon=self.cfg.norm_epsilon,
        post_norms=self.post_norms,
        dropout_rate=self.cfg.dropout,
    )

  def stack_runs(
      self,
      prefix: str,
      layers: int,
      cross: Optional[Callable[[int], Optional[blocks.Sublayer]]] = None,
      breaks: Sequence[int] = (),
      attention: Optional[Callable[[int], blocks.Sublayer]] = None,
  ) -> list[stack.LayerRun]:
    """The runs (``stack.runs``: of identical layers when ``scan_layers``,
    else one per layer) of ``layers`` blocks named ``prefix_<i>``, with
    the cross-attention ``cross(i)`` (or none), the self-attention
    ``attention(i)`` where layers differ in it, and runs starting at
    ``breaks``. Works on an unbound module."""
    keys = [
        (
            self.feed_forward_sublayer(i),
            cross(i) if cross else None,
            attention(i) if attention else None,
        )
        for i in range(layers)
    ]
    return stack.runs(prefix, keys, self.cfg.scan_layers, breaks)

  def layer_runs(self) -> list[stack.LayerRun]:
    """The runs of every stack of the model (``scan_layers`` lays out its
    parameters by them); works on an unbound module."""
    return self.stack_runs("layer", self.cfg.num_layers)

  def make_stack(
      self,
      runs: Sequence[stack.LayerRun],
      attention: Union[blocks.Sublayer, Callable[[int], blocks.Sublayer]],
      cross: Optional[Callable[[int], Optional[blocks.Sublayer]]] = None,
  ) -> list[tuple[stack.LayerRun, blocks.ResidualBlock]]:
    """(run, its block) of each run (``make_block``); ``attention`` is
    every layer's self-attention, or ``attention(i)`` layer i's."""
    at = (
        (lambda i: attention)
        if isinstance(attention, blocks.Sublayer)
        else attention
    )
    return [
        (
            r,
            self.make_block(
                r.name,
                r.first,
                at(r.first),
                cross=cross(r.first) if cross else None,
            ),
        )
        for r in runs
    ]
