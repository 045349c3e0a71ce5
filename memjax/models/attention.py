"""Attention kinds: the base class, causal attention with absolute
positions, and the sinusoid position table.

Every attention kind subclasses ``AttentionKind``; the engine's spec and
the methods' declare them under the names ``model.attention`` picks
('vanilla' here; 'rpe', 'xl' and 'lamemo' in ``memjax/methods/recurrent``). A kind owns its recurrent memory: the class says whether it
carries one and how it spans the layer stack (``init_stack_memory``,
``enter_stack``, ``leave_stack``), so ``TransformerLM`` runs any kind
without knowing it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors
from memjax import extend
from memjax.models import blocks
from memjax.models import multihead
from memjax.models import rotary

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class StackDims:
  """The sizes of a layer stack, for making its empty memory.

  Attributes:
    num_layers: number of blocks.
    mem_len: M, memory slots per lane.
    d_model: D.
    num_heads: H.
    head_dim: d_h.
    dtype: compute dtype.
    options: the kind's options (``model.attention_options``).
  """

  num_layers: int
  mem_len: int
  d_model: int
  num_heads: int
  head_dim: int
  dtype: Any = jnp.float32
  options: Any = None


class AttentionKind(nn.Module):
  """Base of the attention kinds (``extend.Method.attention``).

  A kind is built with ``d_model``, ``num_heads``, ``head_dim``,
  ``mem_len``, ``dropout_rate``, ``dtype`` and its own options (the keys of
  ``model.attention_options``), and called as
  ``attn(x [B, L, D] normed, memory | None, *, deterministic)
  -> (y [B, L, D], new_memory | None)``.

  Class-level hooks (read on the class: no instance, no parameters):

  * ``ABSOLUTE_POSITIONS``: the model adds sinusoid positions to the
    embeddings (kinds with relative positions leave them out).
  * ``RECURRENT``: the kind carries a memory across segments when
    ``mem_len > 0``.
  * ``init_stack_memory(batch_size, dims)``: the empty memory of the whole
    stack. By default a tuple with ``init_layer_memory`` per layer.
  * ``enter_stack(x, memory)`` -> (rows the blocks run over, per-layer
    memories): by default the segment itself and the tuple.
  * ``leave_stack(x, h, g, layer_memories, memory, mem_len)`` -> the
    segment's rows of the last block's output and g, and the stack's new
    memory: by default (h, g, tuple of the layers' new memories).

  * ``decodes_cached(mem_len)`` and ``cached_context(query, segment_len,
    mem_len)``: whether the kind decodes with a key/value cache
    (``lm_decoding``; called with ``pos``, the cache's first slot, and a
    ``mask`` of the slots each query reads), and the first stream position
    a query reads there, as training and evaluation give it;
    ``cached_decoder(mem_len)``: the decoder of a kind whose memory is not
    the keys a cache keeps (LaMemo's), None for the engine's.

  A kind whose memory is not one entry per layer (LaMemo prepends memory
  rows to the segment) overrides the three stack hooks.
  """

  ABSOLUTE_POSITIONS: ClassVar[bool] = False
  RECURRENT: ClassVar[bool] = False

  @classmethod
  def decodes_cached(cls, mem_len: int) -> bool:
    """Whether a model of this kind (memory length ``mem_len``) decodes
    with a key/value cache; by default not."""
    del mem_len
    return False

  @classmethod
  def cached_decoder(cls, mem_len: int) -> Any:
    """A ``lm_decoding.CachedDecoder`` subclass of the kind's own (one
    whose memory is not the keys a cache keeps), or None for the engine's
    decoder."""
    del mem_len
    return None

  @classmethod
  def cached_context(
      cls, query: Array, segment_len: int, mem_len: int
  ) -> Array:
    """The first stream position each query reads in cached decoding.

    Args:
      query: int array, the queries' stream positions.
      segment_len: T, the segments of evaluation and generation.
      mem_len: M, the model's memory length.

    Returns:
      int array like ``query``; by default 0, every earlier position.
    """
    del segment_len, mem_len
    return jnp.zeros_like(query)

  @classmethod
  def carries_memory(cls, mem_len: int) -> bool:
    """Whether a model of this kind carries memory across segments."""
    return cls.RECURRENT and mem_len > 0

  @classmethod
  def init_layer_memory(cls, batch_size: int, dims: StackDims) -> Any:
    """One layer's empty memory (recurrent kinds define it)."""
    raise NotImplementedError(f"{cls.__name__} carries no memory")

  @classmethod
  def init_stack_memory(cls, batch_size: int, dims: StackDims) -> Any:
    """The empty memory of a stack of ``dims.num_layers`` layers, or None."""
    if not cls.carries_memory(dims.mem_len):
      return None
    return tuple(
        cls.init_layer_memory(batch_size, dims) for _ in range(dims.num_layers)
    )

  @classmethod
  def enter_stack(cls, x: Array, memory: Any) -> tuple[Array, Sequence[Any]]:
    """([B, R + T, D] rows the blocks run over, per-layer memories)."""
    return x, memory

  @classmethod
  def leave_stack(
      cls,
      x: Array,
      h: Array,
      g: Array,
      layer_memories: Sequence[Any],
      memory: Any,
      mem_len: int,
  ) -> tuple[Array, Array, Any]:
    """The segment's rows of the stack's output and the new memory.

    Args:
      x: [B, T, D] the segment's embeddings (the stack's input).
      h: [B, R + T, D] the last block's output.
      g: [B, R + T, D] the last block's g.
      layer_memories: each layer's new memory.
      memory: the memory the stack started from.
      mem_len: the model's M.

    Returns:
      (h [B, T, D], g [B, T, D], the stack's new memory).
    """
    del x, memory, mem_len
    return h, g, tuple(layer_memories)


@dataclasses.dataclass(frozen=True)
class VanillaOptions:
  """``model.attention_options`` of the 'vanilla' kind: the pretrained
  families' variants.

  Attributes:
    num_kv_heads: key/value heads (a divisor of H); 0 = H.
    qkv_bias: biases on the query, key and value projections.
    out_bias: a bias on the output projection.
    rope_theta: rotary positions' base; 0 = no rotary positions.
    rope_scaling_factor: rope scaling's factor; 0 = none.
    rope_low_freq_factor: Llama 3 scaling's low-frequency factor
      (``rotary.inverse_frequencies``).
    rope_high_freq_factor: its high-frequency factor.
    rope_original_max_len: its original context length.
    rope_scaling_type: the scaling ``rope_scaling_factor`` applies:
      'llama3', 'linear' (every speed divided by the factor, i.e. the
      positions: Hugging Face's rope type 'linear') or 'yarn'
      (``rotary.yarn``, over ``rope_original_max_len`` positions).
    rope_beta_fast, rope_beta_slow, rope_truncate: YaRN's ``beta_fast``,
      ``beta_slow`` and ``truncate``.
    rope_attention_factor: the rotary tables' factor (YaRN's
      ``attention_factor``; the queries and keys are scaled by it).
    qk_norm: 'none', or the norm of each head's queries and keys over d_h
      before rotary positions (``blocks.NORMS``): 'rms' (Qwen3's q_norm and
      k_norm) or 'rms_plus_one' (Gemma 3's); the parameters
      ``query_norm/scale`` and ``key_norm/scale``.
    qk_norm_epsilon: their epsilon.
    query_pre_attn_scalar: scores are divided by its square root (Gemma
      3's ``query_pre_attn_scalar``); 0 = by sqrt(d_h).
    sliding_window: each query attends to the last ``sliding_window``
      positions only, itself included (Mistral's); 0 = every earlier one.
  """

  num_kv_heads: int = 0
  qkv_bias: bool = False
  out_bias: bool = False
  rope_theta: float = 0.0
  rope_scaling_factor: float = 0.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  rope_scaling_type: str = "llama3"
  rope_beta_fast: float = 32.0
  rope_beta_slow: float = 1.0
  rope_truncate: bool = True
  rope_attention_factor: float = 1.0
  qk_norm: str = "none"
  qk_norm_epsilon: float = 1e-6
  query_pre_attn_scalar: float = 0.0
  sliding_window: int = 0


class CausalSelfAttention(AttentionKind):
  """Multi-head causal self-attention over the current segment only.

  The 'vanilla' kind: absolute positions, no memory, computed by the one
  attention core (``multihead.MultiHeadAttention``, 'param' layout). Its
  options (``VanillaOptions``, ``model.attention_options``) give the
  pretrained families' variants: grouped-query attention (``num_kv_heads``
  key/value heads, each shared by ``num_heads / num_kv_heads`` query heads,
  as Hugging Face's ``repeat_kv``), biases on the q/k/v projections (GPT-2,
  Qwen2) and on the output (GPT-2), and rotary positions
  (``memjax.models.rotary``).

  Attributes:
    d_model: D.
    num_heads: H.
    head_dim: d_h.
    dropout_rate: dropout on attention probabilities.
    dtype: compute dtype; softmax runs in float32.
    options: the kind's options.
  """

  d_model: int
  num_heads: int
  head_dim: int
  mem_len: int = 0
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  options: VanillaOptions = VanillaOptions()

  ABSOLUTE_POSITIONS: ClassVar[bool] = True

  @classmethod
  def decodes_cached(cls, mem_len: int) -> bool:
    del mem_len
    return True

  def setup(self) -> None:
    # The core's parameters sit directly in this layer's scope (query,
    # key, value, out and their biases: the saved paths).
    self.core = multihead.core_of(self, **core_options(self.options))
    nn.share_scope(self, self.core)

  def __call__(
      self,
      x: Array,
      memory: Any = None,
      *,
      deterministic: bool = True,
      mask: Optional[Array] = None,
      pos: Optional[Array] = None,
      positions: Optional[Array] = None,
  ) -> tuple[Array, Any]:
    """Attends causally within the segment, or over a key/value cache.

    Args:
      x: [B, T, D] pre-normalised layer input.
      memory: None (no recurrence), or in cached decoding
        (``memjax.models.lm_decoding``) this layer's (keys, values)
        [B, L, H_kv, d_h], x's rows going to slots ``pos``..``pos`` + T - 1.
      deterministic: disables dropout.
      mask: with a cache: [B, 1, 1, L] bool, the slots a row may read.
      pos: with a cache: scalar int32, x's first slot.
      positions: with a cache: [B, T] int32 x's rotary positions.

    Returns:
      ([B, T, D] output after the output projection, the updated cache or
      None).
    """
    if memory is None:
      y, _ = self.core(x, deterministic=deterministic, causal=True)
      return y, None
    return self.core(
        x,
        memory,
        deterministic=deterministic,
        causal=True,
        mask=mask,
        pos=pos,
        positions=positions,
    )


def core_options(options: Any) -> dict[str, Any]:
  """The attention core's settings (``multihead.MultiHeadAttention``) of
  the 'vanilla' kind's options (a ``VanillaOptions``, or a mapping of its
  fields): grouped heads, biases, rotary positions.

  Raises:
    errors.ConfigError: an option the kind does not take.
  """
  if not isinstance(options, VanillaOptions):
    options = extend.make_options(
        CausalSelfAttention,
        options,
        "model.attention_options of attention kind 'vanilla'",
    )
  if options.sliding_window < 0:
    raise errors.ConfigError(
        "model.attention_options.sliding_window must be >= 0 (0 = none), got "
        f"{options.sliding_window}"
    )
  if options.qk_norm != "none" and options.qk_norm not in blocks.NORMS:
    raise errors.ConfigError(
        "model.attention_options.qk_norm must be 'none' or one of "
        f"{', '.join(blocks.NORMS)}, got {options.qk_norm!r}"
    )
  rope = None
  if options.rope_theta:
    rope = rotary.Rope(
        options.rope_theta,
        scaling_factor=options.rope_scaling_factor,
        low_freq_factor=options.rope_low_freq_factor,
        high_freq_factor=options.rope_high_freq_factor,
        original_max_len=options.rope_original_max_len,
        scaling_type=options.rope_scaling_type,
        beta_fast=options.rope_beta_fast,
        beta_slow=options.rope_beta_slow,
        truncate=bool(options.rope_truncate),
        attention_factor=options.rope_attention_factor,
    )
  return {
      "num_kv_heads": int(options.num_kv_heads),
      "qkv_bias": bool(options.qkv_bias),
      "out_bias": bool(options.out_bias),
      "rope": rope,
      "qk_norm": "" if options.qk_norm == "none" else str(options.qk_norm),
      "qk_norm_epsilon": float(options.qk_norm_epsilon),
      "query_pre_attn_scalar": float(options.query_pre_attn_scalar),
      "sliding_window": int(options.sliding_window),
  }


def reads_whole_sequences(name: str, kind: type) -> Optional[str]:
  """The ``extend.Family.refuses_attention`` of a family that reads each
  sequence whole, in both directions (the encoders): the plain kind, or a
  kind that attends both ways (``causal=False``) without a memory."""
  del name
  if kind is CausalSelfAttention:
    return None
  if kind.RECURRENT:
    return RECURRENT_REFUSAL
  if "causal" not in {f.name for f in dataclasses.fields(kind)}:
    return "it attends causally only"
  return None


def check_sliding_window(model: Any, refuses: Optional[Callable]) -> None:
  """Refuses a sliding window (``attention_options.sliding_window``, or
  ``family_options.local_attention_options``'s: Mistral's, Gemma 3's local
  layers) in a family that reads each sequence whole (``refuses`` is
  ``reads_whole_sequences``: the encoder, and the encoder-decoder, whose
  decoder also decodes with a cache the window does not cut). A decoder
  LM's causal self-attention applies it.

  Raises:
    errors.ConfigError: naming the setting and why.
  """
  local = dict(model.family_options or {}).get("local_attention_options")
  windows = (
      dict(model.attention_options or {}).get("sliding_window", 0),
      dict(local or {}).get("sliding_window", 0),
  )
  if any(windows) and refuses is reads_whole_sequences:
    raise errors.ConfigError(
        f"model.family {model.family!r} does not take a sliding window "
        f"(model.attention_options.sliding_window {max(windows)}): it "
        "applies to a decoder LM's causal self-attention (decoder_lm); "
        "set it to 0"
    )


# Why a family that reads each sequence whole refuses a recurrent kind.
RECURRENT_REFUSAL = (
    "a recurrent memory is carried from one segment of a stream to the "
    "next, and this family reads each sequence whole"
)


def plain_only(why: str) -> Callable[[str, type], Optional[str]]:
  """A family's ``extend.Family.refuses_attention`` that applies the plain
  kind ('vanilla') only: a recurrent kind is refused as a memory the family
  has no segments for, another kind with ``why``."""

  def refuses(name: str, kind: type) -> Optional[str]:
    del name
    if kind is CausalSelfAttention:
      return None
    if kind.RECURRENT:
      return RECURRENT_REFUSAL
    return why

  return refuses
