"""Pre-LayerNorm decoder-only Transformer language model.

The model is a pure function of (params, tokens, memory): recurrent memory
(Transformer-XL, LaMemo) is an explicit pytree passed in and returned. It
returns what every loss needs (``LMOutput``): the target log-probability under
the (adaptive) softmax, the softmax log-normaliser, and the TRIME memory
features ``g`` = the input of the last layer's feed-forward block after its
LayerNorm.

Block: ``h = x + Dropout(Attn(LN1(x), mem)); out = h + Dropout(FFN(LN2(h)))``.
Attention modules share one signature,
``attn(x_normed [B,T,D], memory | None, deterministic=...) -> (y [B,T,D], new_memory)``.

Recurrent memory (``attention`` 'xl' or 'lamemo' with ``mem_len > 0``):

* 'xl': a tuple with one ``recurrence.XLMemory`` per layer (the last M normed
  inputs of that layer's attention).
* 'lamemo': ``(inputs, layers)``: an ``XLMemory`` of the last M layer-0 inputs
  and one ``recurrence.LaMemoMemory`` per layer. The M memory rows are
  prepended to the segment and run through every block with it
  ([B, M + T, D]); ``features`` and ``hidden`` keep only the T segment rows.
  See docs/lamemo.md.

``init_memory(batch_size)`` makes an empty memory (None for models without
recurrence) and ``reset_memory(memory, reset)`` empties the lanes where
``reset`` is set.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
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


ATTENTION_KINDS = ("vanilla", "rpe", "xl", "lamemo")
# Kinds that carry a memory across segments when mem_len > 0.
RECURRENT_KINDS = ("xl", "lamemo")


def make_attention(kind: str, **kwargs) -> nn.Module:
  """Builds one attention module of the given kind.

  Args:
    kind: 'vanilla' (absolute positions, no memory), 'rpe' (disentangled
      relative positions, no memory), 'xl' (Transformer-XL recurrence) or
      'lamemo' (look-ahead memory).
    **kwargs: module attributes (d_model, num_heads, head_dim, mem_len,
      dropout_rate, dtype, and kind-specific switches).

  Raises:
    ValueError: for an unknown kind.
  """
  kind_kwargs = dict(kwargs.pop("extra", {}) or {})
  if kind == "vanilla":
    return attention_lib.CausalSelfAttention(**kwargs)
  if kind == "rpe":
    from memjax.models import relative  # pylint: disable=g-import-not-at-top

    return relative.DisentangledAttention(**kwargs, **kind_kwargs)
  if kind == "xl":
    from memjax.models import relative  # pylint: disable=g-import-not-at-top

    return relative.XLAttention(**kwargs, **kind_kwargs)
  if kind == "lamemo":
    from memjax.models import lamemo  # pylint: disable=g-import-not-at-top

    return lamemo.LaMemoAttention(**kwargs, **kind_kwargs)
  raise errors.ConfigError(
      f"unknown model.attention {kind!r}; choose one of {ATTENTION_KINDS}"
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


class FeedForward(nn.Module):
  """Position-wise feed-forward block: D -> F -> D with ReLU."""

  d_model: int
  d_ff: int
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    """[B, T, D] -> [B, T, D]."""
    h = nn.Dense(
        self.d_ff,
        dtype=self.dtype,
        name="wi",
        kernel_init=nn.with_logical_partitioning(
            nn.initializers.xavier_uniform(), ("embed", "mlp")
        ),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
    )(x)
    h = nn.relu(h)
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return nn.Dense(
        self.d_model,
        dtype=self.dtype,
        name="wo",
        kernel_init=nn.with_logical_partitioning(
            nn.initializers.xavier_uniform(), ("mlp", "embed")
        ),
        bias_init=nn.with_logical_partitioning(
            nn.initializers.zeros, ("embed",)
        ),
    )(h)


def layer_norm(name: str, dtype) -> nn.LayerNorm:
  return nn.LayerNorm(
      dtype=dtype,
      name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
  )


class DecoderBlock(nn.Module):
  """One pre-LN decoder layer; returns (out, g, new_memory)."""

  d_model: int
  num_heads: int
  head_dim: int
  d_ff: int
  attention: str = "vanilla"
  attention_options: Any = None
  mem_len: int = 0
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(
      self, x: Array, memory: Any, deterministic: bool
  ) -> tuple[Array, Array, Any]:
    """[B, T, D] -> ([B, T, D] output, [B, T, D] g, new memory)."""
    attn = make_attention(
        self.attention,
        d_model=self.d_model,
        num_heads=self.num_heads,
        head_dim=self.head_dim,
        mem_len=self.mem_len,
        dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype,
        extra=self.attention_options,
        name="attention",
    )
    y, new_memory = attn(
        layer_norm("ln_attn", self.dtype)(x),
        memory,
        deterministic=deterministic,
    )
    h = x + nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    h = nn.with_logical_constraint(h, ("batch", "length", "embed"))
    g = layer_norm("ln_ffn", self.dtype)(h)
    f = FeedForward(
        self.d_model, self.d_ff, self.dropout_rate, self.dtype, name="ffn"
    )(g, deterministic=deterministic)
    out = h + nn.Dropout(self.dropout_rate)(f, deterministic=deterministic)
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
    attention_dropout_rate: dropout on attention probabilities.
    attention: attention kind (see ``make_attention``).
    attention_options: kind-specific attention attributes (a dict).
    mem_len: recurrent memory length M (xl, lamemo; 0 = no memory). Changing
      it changes no parameter, so a model can be evaluated with another M.
    max_len: longest segment, for the absolute position table.
    remat: rematerialise each block in the backward pass.
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
  attention_dropout_rate: float = 0.0
  attention: str = "vanilla"
  attention_options: Any = None
  mem_len: int = 0
  max_len: int = 4096
  remat: bool = False
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
            mem_len=self.mem_len,
            dropout_rate=self.dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            dtype=self.dtype,
            name=f"layer_{i}",
        )
        for i in range(self.num_layers)
    ]
    self.final_norm = layer_norm("final_norm", self.dtype)
    self.embed_dropout = nn.Dropout(self.dropout_rate)

  def carries_memory(self) -> bool:
    """Whether the model carries a recurrent memory across segments."""
    return self.attention in RECURRENT_KINDS and self.mem_len > 0

  def init_memory(self, batch_size: int) -> Any:
    """An empty memory for ``batch_size`` lanes (all slots invalid).

    Works on an unbound module. Returns None for models without recurrence.
    'xl': a tuple of ``num_layers`` ``XLMemory`` (x [B, M, D] compute dtype).
    'lamemo': (``XLMemory`` of the layer-0 inputs, x [B, M, D] compute dtype;
    a tuple of ``num_layers`` ``LaMemoMemory`` with float32 c [B, M, H, dh]
    and lse [B, M, H]).
    """
    if not self.carries_memory():
      return None
    inputs = recurrence.init_xl_memory(
        batch_size, self.mem_len, self.d_model, self.dtype
    )
    if self.attention == "xl":
      return tuple(inputs for _ in range(self.num_layers))
    layers = tuple(
        recurrence.init_lamemo_memory(
            batch_size, self.mem_len, self.num_heads, self.head_dim
        )
        for _ in range(self.num_layers)
    )
    return inputs, layers

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
    logp, log_z = self.embedder.score(hidden, targets)
    return LMOutput(logp, log_z, g, hidden, new_memory)

  def hidden_states(
      self, inputs: Array, memory: Any = None, *, deterministic: bool = True
  ) -> tuple[Array, Array, Any]:
    """[B, T] ids -> (final hidden [B,T,D], g [B,T,D], new memory)."""
    x = self.embedder.embed(inputs)
    if self.attention == "vanilla":
      t = inputs.shape[1]
      if t > self.max_len:
        raise errors.ConfigError(
            f"segment length {t} exceeds model.max_len {self.max_len}"
        )
      x = x + jnp.asarray(sinusoid_table(t, self.d_model), self.dtype)[None]
    x = self.embed_dropout(x, deterministic=deterministic)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    if self.attention == "lamemo" and memory is not None:
      return self._lamemo_stack(x, memory, deterministic)
    mems = memory if memory is not None else (None,) * self.num_layers
    new_mems = []
    g = x
    for block, mem in zip(self.blocks, mems):
      x, g, new_mem = block(x, mem, deterministic)
      new_mems.append(new_mem)
    hidden = self.final_norm(x)
    new_memory = tuple(new_mems) if memory is not None else None
    return hidden, g, new_memory

  def _lamemo_stack(
      self, x: Array, memory: Any, deterministic: bool
  ) -> tuple[Array, Array, Any]:
    """LaMemo blocks over concat(memory rows, segment) [B, M + T, D].

    The memory rows are the stored layer-0 inputs of the last M tokens; every
    block refreshes them (look-ahead) and the next block reads them.
    """
    inputs, layers = memory
    mem_len = inputs.x.shape[1]
    rows = jax.lax.stop_gradient(inputs.x).astype(x.dtype)
    h = jnp.concatenate([rows, x], axis=1)
    new_layers = []
    g = h
    for block, mem in zip(self.blocks, layers):
      h, g, new_mem = block(h, mem, deterministic)
      new_layers.append(new_mem)
    hidden = self.final_norm(h[:, mem_len:])
    new_inputs = recurrence.push_xl_memory(inputs, x, self.mem_len or mem_len)
    return hidden, g[:, mem_len:], (new_inputs, tuple(new_layers))

  def log_probs(self, hidden: Array) -> Array:
    """[..., D] final hidden states -> [..., V] float32 log-probabilities."""
    return self.embedder.log_probs(hidden)
