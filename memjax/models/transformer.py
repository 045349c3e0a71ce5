"""Pre-LayerNorm decoder-only Transformer language model ('decoder_lm').

The model is a pure function of (params, tokens, memory): recurrent memory
(Transformer-XL, LaMemo) is an explicit pytree passed in and returned. It
returns what every loss needs (``LMOutput``): the target log-probability under
the (adaptive) softmax, the softmax log-normaliser, and the TRIME memory
features ``g`` = the input of the last layer's feed-forward block after its
LayerNorm.

Blocks are ``blocks.ResidualBlock`` (pre-LN:
``h = x + Dropout(Attn(LN1(x), mem)); out = h + Dropout(FFN(LN2(h)))``),
with sub-layers named ``attention``, ``ln_attn``, ``ffn`` and ``ln_ffn``.
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

from memjax import errors
from memjax import registry
from memjax.models import adaptive
from memjax.models import attention as attention_lib
from memjax.models import blocks
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


class TransformerLM(blocks.BlockStack):
  """Decoder-only Transformer LM with adaptive input and softmax.

  Attributes (besides ``blocks.BlockStack``'s, the sizes, dropouts,
  feed-forward kind, LayerNorm settings, max_len and dtype):
    cutoffs: adaptive input/softmax cluster boundaries; () for a plain softmax.
    adaptive_factor: embedding-dimension shrink factor per cluster.
    scale_embedding: multiply input embeddings by sqrt(D).
    adaptive_dropout: dropout inside the adaptive softmax's tail clusters
      (fairseq's ``adaptive_softmax_dropout``), training only.
    attention: attention kind, a name in ``registry.ATTENTION``.
    attention_options: kind-specific attention attributes (a dict).
    feed_forward_layers: 1-based numbers of the layers that use
      ``feed_forward``; the others use 'ffn' with the options it takes. ()
      = every layer.
    mem_len: recurrent memory length M (recurrent attention kinds; 0 = no
      memory). Changing it changes no parameter, so a model can be
      evaluated with another M.
    remat: rematerialise each block in the backward pass.
    final_layer_norm: pre-LN only: a LayerNorm after the last block (False
      is fairseq's ``no_decoder_final_norm``, as in transformer_lm_wiki103).
      Post-LN ('post': LayerNorm after each residual sum) has none.
    softmax_chunk: positions scored at a time by the adaptive softmax.
  """

  cutoffs: Sequence[int] = ()
  adaptive_factor: int = 4
  scale_embedding: bool = False
  adaptive_dropout: float = 0.0
  attention: str = "vanilla"
  attention_options: Optional[Mapping[str, Any]] = None
  feed_forward_layers: Sequence[int] = ()
  mem_len: int = 0
  remat: bool = False
  final_layer_norm: bool = True
  softmax_chunk: int = 4096

  def setup(self):
    blocks.check_norm_position(self.norm_position)
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
        nn.remat(blocks.ResidualBlock, static_argnums=(3,))
        if self.remat
        else blocks.ResidualBlock
    )
    attend = blocks.make_sublayer(
        registry.ATTENTION,
        self.attention,
        self.attention_options,
        "model.attention_options",
        mem_len=self.mem_len,
        **self.attention_settings(),
    )
    self.blocks = [
        self.make_block(
            f"layer_{i}",
            attend,
            feed_forward,
            cross=self.cross_sublayer(i),
            block_cls=block_cls,
        )
        for i, feed_forward in enumerate(self._feed_forward_kinds())
    ]
    # Post-LN blocks end normalised: no final LayerNorm (Transformer-XL).
    pre = self.norm_position == "pre"
    use_final = pre and self.final_layer_norm
    self.final_norm = self.norm("final_norm") if use_final else None
    self.embed_dropout = nn.Dropout(self.dropout_rate)

  def cross_sublayer(self, layer: int) -> Optional[blocks.Sublayer]:
    """The cross-attention of the 0-based ``layer``: None (none here).

    A subclass whose layers attend to something outside the sequence
    returns its sub-layer for those layers; ``hidden_states`` never feeds
    one, so such a subclass runs its blocks itself.
    """
    del layer
    return None

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
    sizes = ("num_layers", "mem_len", "d_model", "num_heads", "head_dim")
    dims = attention_lib.StackDims(
        **{k: getattr(self, k) for k in sizes},
        dtype=self.dtype,
        options=self.attention_options,
    )
    return self.attention_kind().init_stack_memory(batch_size, dims)

  def reset_memory(self, memory: Any, reset: Array) -> Any:
    """Empties the memory of the lanes where ``reset`` ([B] bool) is True."""
    if memory is None:
      return None
    return recurrence.reset_memory(memory, reset)

  def forward(
      self,
      inputs: Array,
      targets: Optional[Array],
      deterministic: bool,
      memory: Any = None,
  ) -> LMOutput:
    """Runs the LM on one segment (``model(inputs, targets, memory)``).

    Args:
      inputs: [B, T] int32 token ids.
      targets: [B, T] int32 next-token ids, or None (then no scores).
      deterministic: disables dropout.
      memory: the memory from the previous segment (see ``init_memory``), or
        None (no memory: each segment on its own).

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

  def embed(self, inputs: Array, deterministic: bool) -> Array:
    """[B, T] ids -> [B, T, D] the first block's input.

    Token embeddings, plus sinusoid positions for an attention kind with
    absolute positions, then dropout.
    """
    x = self.embedder.embed(inputs)
    if self.attention_kind().ABSOLUTE_POSITIONS:
      t = inputs.shape[-1]
      if t > self.max_len:
        raise errors.ConfigError(
            f"segment length {t} exceeds model.max_len {self.max_len}"
        )
      table = blocks.sinusoid_table(t, self.d_model)
      x = x + jnp.asarray(table, self.dtype)[None]
    x = self.embed_dropout(x, deterministic=deterministic)
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))

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
    x = self.embed(inputs, deterministic)
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


# Keys of ``config.model`` that the model families take under their name.
_SAME_KEYS = (
    "num_layers",
    "d_model",
    "num_heads",
    "head_dim",
    "d_ff",
    "feed_forward",
    "norm_position",
    "max_len",
)


def block_settings(mcfg: Any) -> dict[str, Any]:
  """The ``blocks.BlockStack`` settings a family reads from ``config.model``.

  All but ``vocab_size`` and ``dtype``, which the family is given.
  """
  return dict(
      {k: getattr(mcfg, k) for k in _SAME_KEYS},
      dropout_rate=mcfg.dropout,
      attention_dropout_rate=mcfg.attention_dropout,
      feed_forward_options=config_options(mcfg.feed_forward_options),
      norm_epsilon=float(mcfg.norm_epsilon),
      activation=str(getattr(mcfg, "activation", "relu")),
  )


def lm_settings(mcfg: Any, *, vocab_size: int, dtype: Any) -> dict[str, Any]:
  """The ``TransformerLM`` attributes that a model config describes.

  Args:
    mcfg: the model config (read by attribute; any object with the keys).
    vocab_size: V.
    dtype: the compute dtype (``mcfg.dtype`` resolved).
  """
  return dict(
      block_settings(mcfg),
      vocab_size=vocab_size,
      dtype=dtype,
      cutoffs=tuple(mcfg.cutoffs),
      adaptive_factor=mcfg.adaptive_factor,
      scale_embedding=mcfg.scale_embedding,
      adaptive_dropout=mcfg.adaptive_dropout,
      attention=mcfg.attention,
      attention_options=config_options(mcfg.attention_options),
      feed_forward_layers=tuple(mcfg.get("feed_forward_layers", ())),
      mem_len=mcfg.mem_len,
      remat=mcfg.remat,
      softmax_chunk=mcfg.softmax_chunk,
      final_layer_norm=mcfg.final_layer_norm,
  )


def family_options(mcfg: Any, family: str, names: Sequence[str]) -> dict:
  """``model.family_options`` of ``family``, which takes the options ``names``.

  Raises:
    errors.ConfigError: an option the family does not take.
  """
  opts = dict(config_options(mcfg.get("family_options")) or {})
  unknown = sorted(set(opts) - set(names))
  if unknown:
    raise errors.ConfigError(
        f"model.family_options has {', '.join(unknown)}, which model family "
        f"{family!r} does not take; its options: {', '.join(names)}"
    )
  return opts


@registry.MODEL_FAMILIES.register("decoder_lm")
def decoder_lm(mcfg: Any, *, vocab_size: int, dtype: Any) -> TransformerLM:
  """The ``TransformerLM`` that a model config (``config.model``) describes.

  Args:
    mcfg: the model config (read by attribute; any object with the keys).
    vocab_size: V.
    dtype: the compute dtype (``mcfg.dtype`` resolved).
  """
  return TransformerLM(**lm_settings(mcfg, vocab_size=vocab_size, dtype=dtype))
