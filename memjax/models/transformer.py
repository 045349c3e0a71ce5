"""Pre-LayerNorm decoder-only Transformer language model ('decoder_lm').

The model is a pure function of (params, tokens, memory): recurrent memory
(Transformer-XL, LaMemo) is an explicit pytree passed in and returned. It
returns what every loss needs (``LMOutput``): the target log-probability under
the (adaptive) softmax, the softmax log-normaliser, and the TRIME memory
features ``g`` = the input of the last layer's feed-forward block after its
LayerNorm.

Block: ``h = x + Dropout(Attn(LN1(x), mem)); out = h + Dropout(FFN(LN2(h)))``.
The attention and the feed-forward sub-layers are looked up by name in
``memjax.registry.ATTENTION`` (``attention``) and ``FEED_FORWARD``
(``feed_forward``), with their options; see ``attention.AttentionKind`` and
``feed_forward``. Attention kinds share one signature,
``attn(x_normed [B,T,D], memory | None, deterministic=...) -> (y [B,T,D], new_memory)``.

The attention kind owns the recurrent memory: whether the model carries one
(``carries_memory``), its layout over the stack (``init_memory(batch_size)``
makes an empty one, None for models without recurrence) and how the blocks
run over it (``AttentionKind.enter_stack`` / ``leave_stack``; LaMemo
prepends memory rows to the segment). ``reset_memory(memory, reset)``
empties the lanes where ``reset`` is set.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import registry
from memjax.models import adaptive
from memjax.models import attention as attention_lib
from memjax.models import recurrence

Array = jax.Array


@flax.struct.dataclass
class LMOutput:
  """What the language model returns.

  Attributes:
    target_logprob: [B, T] float32 log p(target) (None without targets).
    log_z: [B, T] float32 log-normaliser of the (head) softmax.
    features: [B, T, D] g, the last FFN's LayerNorm output (TRIME keys).
    hidden: [B, T, D] final hidden states after the final LayerNorm.
    memory: per-layer recurrent memory for the next segment, or None.
  """

  target_logprob: Optional[Array]
  log_z: Optional[Array]
  features: Array
  hidden: Array
  memory: Any = None


def make_sublayer(
    reg: registry.Registry,
    kind: str,
    options: Optional[Mapping[str, Any]],
    options_key: str,
    **kwargs,
) -> nn.Module:
  """Builds the module registered as ``kind`` with ``kwargs`` and options.

  Args:
    reg: the registry (``registry.ATTENTION`` or ``FEED_FORWARD``).
    kind: the registered name.
    options: the kind's own attributes (a dict), or None.
    options_key: the config key of ``options``, for messages.
    **kwargs: the attributes every kind of ``reg`` takes (and ``name``).

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
  return cls(**kwargs, **options)


def sinusoid_table(length: int, dim: int) -> np.ndarray:
  """[length, dim] sinusoidal absolute position table (Vaswani et al.)."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  inv = 1.0 / (10000 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  ang = pos * inv[None]
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2] = np.sin(ang)
  table[:, 1::2] = np.cos(ang)[:, : dim // 2]
  return table


NORM_POSITIONS = ("pre", "post")


def layer_norm(name: str, dtype, epsilon: float = 1e-6) -> nn.LayerNorm:
  return nn.LayerNorm(
      epsilon=epsilon,
      dtype=dtype,
      name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
  )


class DecoderBlock(nn.Module):
  """One decoder layer; returns (out, g, new_memory).

  Pre-LN (``norm_position='pre'``, fairseq's ``transformer_lm_wiki103``):
  ``h = x + Drop(Attn(LN1(x))); out = h + Drop(FFN(LN2(h)))``, g = LN2(h).
  Post-LN (``'post'``, Transformer-XL's ``pre_lnorm=False``):
  ``h = LN1(x + Drop(Attn(x))); out = LN2(h + Drop(FFN(h)))``, g = h. In
  both, g (TRIME's memory key) is the feed-forward block's input as that
  block sees it.
  """

  d_model: int
  num_heads: int
  head_dim: int
  d_ff: int
  attention: str = "vanilla"
  attention_options: Any = None
  feed_forward: str = "ffn"
  feed_forward_options: Any = None
  mem_len: int = 0
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  norm_position: str = "pre"
  norm_epsilon: float = 1e-6

  @nn.compact
  def __call__(
      self, x: Array, memory: Any, deterministic: bool
  ) -> tuple[Array, Array, Any]:
    """[B, T, D] -> ([B, T, D] output, [B, T, D] g, new memory)."""
    attn = make_sublayer(
        registry.ATTENTION,
        self.attention,
        self.attention_options,
        "model.attention_options",
        d_model=self.d_model,
        num_heads=self.num_heads,
        head_dim=self.head_dim,
        mem_len=self.mem_len,
        dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype,
        name="attention",
    )
    pre = self.norm_position == "pre"
    ln_attn = layer_norm("ln_attn", self.dtype, self.norm_epsilon)
    ln_ffn = layer_norm("ln_ffn", self.dtype, self.norm_epsilon)
    drop = nn.Dropout(self.dropout_rate)
    y, new_memory = attn(
        ln_attn(x) if pre else x, memory, deterministic=deterministic
    )
    h = x + drop(y, deterministic=deterministic)
    h = h if pre else ln_attn(h)
    h = nn.with_logical_constraint(h, ("batch", "length", "embed"))
    g = ln_ffn(h) if pre else h
    ffn = make_sublayer(
        registry.FEED_FORWARD,
        self.feed_forward,
        self.feed_forward_options,
        "model.feed_forward_options",
        d_model=self.d_model,
        d_ff=self.d_ff,
        dropout_rate=self.dropout_rate,
        dtype=self.dtype,
        name="ffn",
    )
    f = ffn(g, deterministic=deterministic)
    out = h + drop(f, deterministic=deterministic)
    out = out if pre else ln_ffn(out)
    out = nn.with_logical_constraint(out, ("batch", "length", "embed"))
    return out, g, new_memory


class TransformerLM(nn.Module):
  """Decoder-only Transformer LM with adaptive input and softmax.

  Attributes:
    vocab_size: V.
    num_layers: number of decoder blocks.
    d_model: D.
    num_heads: H.
    head_dim: d_h (H * d_h need not equal D).
    d_ff: feed-forward width.
    cutoffs: adaptive input/softmax cluster boundaries; () for a plain softmax.
    adaptive_factor: embedding-dimension shrink factor per cluster.
    scale_embedding: multiply input embeddings by sqrt(D).
    dropout_rate: residual, embedding and FFN dropout.
    adaptive_dropout: dropout inside the adaptive softmax's tail clusters
      (fairseq's ``adaptive_softmax_dropout``), training only.
    attention_dropout_rate: dropout on attention probabilities.
    attention: attention kind, a name in ``registry.ATTENTION``.
    attention_options: kind-specific attention attributes (a dict).
    feed_forward: feed-forward kind, a name in ``registry.FEED_FORWARD``.
    feed_forward_options: kind-specific feed-forward attributes (a dict).
    feed_forward_layers: 1-based numbers of the layers that use
      ``feed_forward``; the others use 'ffn' with the options it takes. ()
      = every layer.
    mem_len: recurrent memory length M (recurrent attention kinds; 0 = no
      memory). Changing it changes no parameter, so a model can be
      evaluated with another M.
    max_len: longest segment, for the absolute position table.
    remat: rematerialise each block in the backward pass.
    norm_position: 'pre' (LayerNorm before each sub-layer, and a final
      LayerNorm) or 'post' (after each residual sum, no final LayerNorm).
    norm_epsilon: LayerNorm epsilon.
    final_layer_norm: pre-LN only: a LayerNorm after the last block (False
      is fairseq's ``no_decoder_final_norm``, as in transformer_lm_wiki103).
    dtype: compute dtype (float32 or bfloat16); parameters stay float32.
    softmax_chunk: positions scored at a time by the adaptive softmax.
  """

  vocab_size: int
  num_layers: int = 2
  d_model: int = 64
  num_heads: int = 2
  head_dim: int = 32
  d_ff: int = 256
  cutoffs: Sequence[int] = ()
  adaptive_factor: int = 4
  scale_embedding: bool = False
  dropout_rate: float = 0.0
  adaptive_dropout: float = 0.0
  attention_dropout_rate: float = 0.0
  attention: str = "vanilla"
  attention_options: Any = None
  feed_forward: str = "ffn"
  feed_forward_options: Any = None
  feed_forward_layers: Sequence[int] = ()
  mem_len: int = 0
  max_len: int = 4096
  remat: bool = False
  norm_position: str = "pre"
  norm_epsilon: float = 1e-6
  final_layer_norm: bool = True
  dtype: jnp.dtype = jnp.float32
  softmax_chunk: int = 4096

  def setup(self):
    self.embedder = adaptive.AdaptiveEmbed(
        vocab_size=self.vocab_size,
        d_model=self.d_model,
        cutoffs=tuple(self.cutoffs),
        factor=self.adaptive_factor,
        scale=self.scale_embedding,
        chunk_size=self.softmax_chunk,
        tail_dropout=self.adaptive_dropout,
        dtype=self.dtype,
    )
    block_cls = (
        nn.remat(DecoderBlock, static_argnums=(3,))
        if self.remat
        else DecoderBlock
    )
    self.blocks = [
        block_cls(
            d_model=self.d_model,
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            d_ff=self.d_ff,
            attention=self.attention,
            attention_options=self.attention_options,
            feed_forward=kind,
            feed_forward_options=options,
            mem_len=self.mem_len,
            dropout_rate=self.dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            dtype=self.dtype,
            norm_position=self.norm_position,
            norm_epsilon=self.norm_epsilon,
            name=f"layer_{i}",
        )
        for i, (kind, options) in enumerate(self._feed_forward_kinds())
    ]
    if self.norm_position not in NORM_POSITIONS:
      raise errors.ConfigError(
          f"model.norm_position must be one of {NORM_POSITIONS}, got "
          f"{self.norm_position!r}"
      )
    # Post-LN blocks end normalised: no final LayerNorm (Transformer-XL).
    self.final_norm = (
        layer_norm("final_norm", self.dtype, self.norm_epsilon)
        if self.norm_position == "pre" and self.final_layer_norm
        else None
    )
    self.embed_dropout = nn.Dropout(self.dropout_rate)

  def _feed_forward_kinds(self) -> list[tuple[str, Any]]:
    """(kind, options) of each layer's feed-forward sub-layer."""
    chosen = set(self.feed_forward_layers or range(1, self.num_layers + 1))
    plain = registry.FEED_FORWARD.get("ffn")
    takes = {f.name for f in dataclasses.fields(plain)}
    plain_options = {
        k: v for k, v in (self.feed_forward_options or {}).items() if k in takes
    }
    return [
        (self.feed_forward, self.feed_forward_options)
        if i + 1 in chosen
        else ("ffn", plain_options or None)
        for i in range(self.num_layers)
    ]

  def attention_kind(self) -> type[attention_lib.AttentionKind]:
    """The attention kind's class (works on an unbound module)."""
    return registry.ATTENTION.get(self.attention)

  def carries_memory(self) -> bool:
    """Whether the model carries a recurrent memory across segments."""
    return self.attention_kind().carries_memory(self.mem_len)

  def init_memory(self, batch_size: int) -> Any:
    """An empty memory for ``batch_size`` lanes (all slots invalid).

    Works on an unbound module. Returns None for models without recurrence;
    otherwise the attention kind's layout (``init_stack_memory``): 'xl' a
    tuple of ``num_layers`` ``XLMemory`` (x [B, M, D] compute dtype);
    'lamemo' (``XLMemory`` of the layer-0 inputs, a tuple of ``num_layers``
    ``LaMemoMemory`` with float32 c [B, M, H, dh] and lse [B, M, H]).
    """
    if not self.carries_memory():
      return None
    dims = attention_lib.StackDims(
        num_layers=self.num_layers,
        mem_len=self.mem_len,
        d_model=self.d_model,
        num_heads=self.num_heads,
        head_dim=self.head_dim,
        dtype=self.dtype,
        options=self.attention_options,
    )
    return self.attention_kind().init_stack_memory(batch_size, dims)

  def reset_memory(self, memory: Any, reset: Array) -> Any:
    """Empties the memory of the lanes where ``reset`` ([B] bool) is True."""
    if memory is None:
      return None
    return recurrence.reset_memory(memory, reset)

  def __call__(
      self,
      inputs: Array,
      targets: Optional[Array] = None,
      memory: Any = None,
      *,
      deterministic: bool = True,
  ) -> LMOutput:
    """Runs the LM on one segment.

    Args:
      inputs: [B, T] int32 token ids.
      targets: [B, T] int32 next-token ids, or None (then no scores).
      memory: the memory from the previous segment (see ``init_memory``), or
        None (no memory: each segment on its own).
      deterministic: disables dropout.

    Returns:
      An ``LMOutput`` whose arrays cover the T segment positions; ``memory``
      is the memory for the next segment (None if ``memory`` was None).
    """
    h = self.hidden_states(inputs, memory, deterministic=deterministic)
    hidden, g, new_memory = h
    if targets is None:
      return LMOutput(None, None, g, hidden, new_memory)
    logp, log_z = self.embedder.score(hidden, targets, deterministic)
    return LMOutput(logp, log_z, g, hidden, new_memory)

  def hidden_states(
      self, inputs: Array, memory: Any = None, *, deterministic: bool = True
  ) -> tuple[Array, Array, Any]:
    """[B, T] ids -> (final hidden [B,T,D], g [B,T,D], new memory).

    With a memory, the attention kind decides what the blocks run over
    (``enter_stack``: the segment, or memory rows and the segment) and what
    leaves the stack (``leave_stack``: the T segment rows and the new
    memory).
    """
    kind = self.attention_kind()
    x = self.embedder.embed(inputs)
    if kind.ABSOLUTE_POSITIONS:
      t = inputs.shape[1]
      if t > self.max_len:
        raise errors.ConfigError(
            f"segment length {t} exceeds model.max_len {self.max_len}"
        )
      x = x + jnp.asarray(sinusoid_table(t, self.d_model), self.dtype)[None]
    x = self.embed_dropout(x, deterministic=deterministic)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    if memory is None:
      h, mems = x, (None,) * self.num_layers
    else:
      h, mems = kind.enter_stack(x, memory)
    new_mems = []
    g = h
    for block, mem in zip(self.blocks, mems):
      h, g, new_mem = block(h, mem, deterministic)
      new_mems.append(new_mem)
    new_memory = None
    if memory is not None:
      h, g, new_memory = kind.leave_stack(
          x, h, g, new_mems, memory, self.mem_len
      )
    return (self.final_norm(h) if self.final_norm else h), g, new_memory

  def log_probs(self, hidden: Array) -> Array:
    """[..., D] final hidden states -> [..., V] float32 log-probabilities."""
    return self.embedder.log_probs(hidden)


def config_options(options: Any) -> Optional[dict[str, Any]]:
  """A config's options (a ConfigDict or mapping) as a dict; None if empty."""
  if not options:
    return None
  return options.to_dict() if hasattr(options, "to_dict") else dict(options)


def block_settings(mcfg: Any) -> dict[str, Any]:
  """The block settings every model family reads from ``config.model``."""
  return dict(
      num_layers=mcfg.num_layers,
      d_model=mcfg.d_model,
      num_heads=mcfg.num_heads,
      head_dim=mcfg.head_dim,
      d_ff=mcfg.d_ff,
      dropout_rate=mcfg.dropout,
      attention_dropout_rate=mcfg.attention_dropout,
      feed_forward=mcfg.feed_forward,
      feed_forward_options=config_options(mcfg.feed_forward_options),
      norm_position=mcfg.norm_position,
      norm_epsilon=float(mcfg.norm_epsilon),
      max_len=mcfg.max_len,
  )


@registry.MODEL_FAMILIES.register("decoder_lm")
def decoder_lm(mcfg: Any, *, vocab_size: int, dtype: Any) -> TransformerLM:
  """The ``TransformerLM`` that a model config (``config.model``) describes.

  Args:
    mcfg: the model config (read by attribute; any object with the keys).
    vocab_size: V.
    dtype: the compute dtype (``mcfg.dtype`` resolved).
  """
  return TransformerLM(
      vocab_size=vocab_size,
      **block_settings(mcfg),
      cutoffs=tuple(mcfg.cutoffs),
      adaptive_factor=mcfg.adaptive_factor,
      scale_embedding=mcfg.scale_embedding,
      adaptive_dropout=mcfg.adaptive_dropout,
      attention=mcfg.attention,
      attention_options=config_options(mcfg.attention_options),
      feed_forward_layers=tuple(mcfg.get("feed_forward_layers", ())),
      mem_len=mcfg.mem_len,
      remat=mcfg.remat,
      dtype=dtype,
      softmax_chunk=mcfg.softmax_chunk,
      final_layer_norm=mcfg.final_layer_norm,
  )
