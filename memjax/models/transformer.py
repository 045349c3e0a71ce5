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
The model takes its settings whole, ``cfg`` (a
``block_stack.ModelConfig``), whose attention kind and feed-forward kind
are resolved once (``ModelConfig.of`` looks up the names
``model.attention`` and ``model.feed_forward`` in the run's parts), with
their options; see ``attention.AttentionKind`` and
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

from typing import Any, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.models import adaptive
from memjax.models import attention as attention_lib
from memjax.models import block_stack
from memjax.models import blocks
from memjax.models import recurrence
from memjax.models import stack

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


class TransformerLM(block_stack.BlockStack):
  """Decoder-only Transformer LM with adaptive input and softmax.

  Attributes (besides ``block_stack.BlockStack``'s: ``cfg``, whose
  ``cutoffs``, ``adaptive_factor``, ``scale_embedding``, ``adaptive_dropout``,
  ``softmax_chunk`` shape the adaptive input and softmax, ``mem_len`` is the
  recurrent memory length M of a recurrent attention kind (0 = no memory;
  changing it changes no parameter, so a model can be evaluated with another
  M, ``with_settings(mem_len=...)``) and ``final_layer_norm`` (pre-LN only)
  puts a LayerNorm after the last block (False is fairseq's
  ``no_decoder_final_norm``, as in transformer_lm_wiki103; post-LN has none);
  and the family options of 'decoder_lm'):
    positions: what an attention kind with absolute positions adds to the
      embeddings (``POSITIONS``): 'sinusoid', 'learned' (a [max_len, D]
      table ``pos_embed``, GPT-2's wpe) or 'none' (rotary positions).
    tie_embeddings: the softmax reuses the input embeddings.
  """

  positions: str = "sinusoid"
  tie_embeddings: bool = True

  def setup(self):
    if self.positions not in POSITIONS:
      raise errors.ConfigError(
          f"model.family_options.positions must be one of "
          f"{', '.join(POSITIONS)}, got {self.positions!r}"
      )
    self.pos_embed = None
    if self.positions == "learned":
      init = nn.initializers.normal(stddev=0.02)
      self.pos_embed = self.table("pos_embed", init, self.cfg.max_len, None)
    self.embedder = adaptive.AdaptiveEmbed(
        vocab_size=self.cfg.vocab_size,
        d_model=self.cfg.d_model,
        cutoffs=tuple(self.cfg.cutoffs),
        factor=self.cfg.adaptive_factor,
        scale=self.cfg.scale_embedding,
        chunk_size=self.cfg.softmax_chunk,
        tail_dropout=self.cfg.adaptive_dropout,
        dtype=self.cfg.compute_dtype,
        tied=self.tie_embeddings,
    )
    self.blocks = self.make_stack(
        self.layer_runs(), self.attention_sublayer, self.cross_sublayer
    )
    self.ffn_shared = self.shared_params()
    # Post-LN blocks end normalised: no final LayerNorm (Transformer-XL).
    pre = self.cfg.norm_position == "pre"
    use_final = pre and self.cfg.final_layer_norm
    self.final_norm = self.norm("final_norm") if use_final else None
    self.embed_dropout = nn.Dropout(self.cfg.dropout)

  def layer_runs(self) -> list[stack.LayerRun]:
    """The runs of its blocks (``stack``); works on an unbound module."""
    return self.stack_runs(
        "layer",
        self.cfg.num_layers,
        self.cross_sublayer,
        self.stack_breaks(),
        attention=self.attention_sublayer,
    )

  def attention_sublayer(self, layer: int) -> blocks.Sublayer:
    """The self-attention of the 0-based ``layer``: the attention kind
    with its options there (``attention_options_at``)."""
    return blocks.make_sublayer(
        self.cfg.attention_kind,
        self.attention_options_at(layer),
        "model.attention_options of attention kind " f"{self.cfg.attention!r}",
        mem_len=self.cfg.mem_len,
        **self.attention_settings(),
    )

  def stack_breaks(self) -> tuple[int, ...]:
    """Layers where a run must start (``stack.runs``): none here."""
    return ()

  def cross_sublayer(self, layer: int) -> Optional[blocks.Sublayer]:
    """The cross-attention of the 0-based ``layer``: None (none here).

    A subclass whose layers attend to something outside the sequence
    returns its sub-layer for those layers; ``hidden_states`` never feeds
    one, so such a subclass runs its blocks itself.
    """
    del layer
    return None

  def attention_kind(self) -> type[attention_lib.AttentionKind]:
    """The attention kind's class (works on an unbound module)."""
    return self.cfg.attention_kind

  def carries_memory(self) -> bool:
    """Whether the model carries a recurrent memory across segments."""
    return self.attention_kind().carries_memory(self.cfg.mem_len)

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
    cfg = self.cfg
    dims = attention_lib.StackDims(
        num_layers=cfg.num_layers,
        mem_len=cfg.mem_len,
        d_model=cfg.d_model,
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        dtype=cfg.compute_dtype,
        options=cfg.attention_options,
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

    Token embeddings, plus sinusoid or learned positions (``positions``)
    for an attention kind with absolute positions, then dropout.
    """
    x = self.embedder.embed(inputs)
    if self.attention_kind().ABSOLUTE_POSITIONS and self.positions != "none":
      t = inputs.shape[-1]
      if t > self.cfg.max_len:
        raise errors.ConfigError(
            f"segment length {t} exceeds model.max_len {self.cfg.max_len}"
        )
      if self.pos_embed is not None:
        table = self.pos_embed[:t]
      else:
        table = block_stack.sinusoid_table(t, self.cfg.d_model)
      x = x + jnp.asarray(table, self.cfg.compute_dtype)[None]
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
      h, mems = x, None
    else:
      h, mems = kind.enter_stack(x, memory)
    shared = (
        {} if self.ffn_shared is None else {"ffn_shared": self.ffn_shared()}
    )
    h, g, new_mems = stack.apply(self.blocks, h, mems, deterministic, **shared)
    new_memory = None
    if memory is not None:
      h, g, new_memory = kind.leave_stack(
          x, h, g, new_mems, memory, self.cfg.mem_len
      )
    return (self.final_norm(h) if self.final_norm else h), g, new_memory

  def cached_decoder(self) -> Any:
    """The ``lm_decoding.CachedDecoder`` subclass of this model's own, or
    None for the engine's: by default its attention kind's
    (``AttentionKind.cached_decoder``)."""
    return self.attention_kind().cached_decoder(self.cfg.mem_len)

  def log_probs(self, hidden: Array, with_log_z: bool = False) -> Any:
    """[..., D] final hidden states -> [..., V] float32 log-probabilities
    (with ``with_log_z``, and [...] the head's log-normaliser)."""
    return self.embedder.log_probs(hidden, with_log_z)


# ``model.family_options`` of 'decoder_lm' (``decoder_lm``).
POSITIONS = ("sinusoid", "learned", "none")
DECODER_OPTIONS = (
    "positions",
    "norm",
    "tie_embeddings",
    "post_norms",
    "local_layers",
    "local_attention_options",
)


def family_options(
    model: settings_lib.Model, family: str, names: Sequence[str]
) -> dict:
  """``model.family_options`` of ``family``, which takes the options ``names``.

  Raises:
    errors.ConfigError: an option the family does not take.
  """
  opts = dict(model.family_options or {})
  unknown = sorted(set(opts) - set(names))
  if unknown:
    raise errors.ConfigError(
        f"model.family_options has {', '.join(unknown)}, which model family "
        f"{family!r} does not take; its options: {', '.join(names)}"
    )
  return opts


def decoder_lm(
    model: settings_lib.Model, *, vocab_size: int, parts: extend.Parts
) -> TransformerLM:
  """The ``TransformerLM`` that a model's settings describe ('decoder_lm').

  Its ``model.family_options`` (``DECODER_OPTIONS``): ``positions``
  ('sinusoid', 'learned' or 'none'), ``norm`` ('layer', 'rms' or
  'rms_plus_one'), ``tie_embeddings`` (default True), ``post_norms``
  (default False), ``local_layers`` (1-based, default none) and
  ``local_attention_options`` (``block_stack.BlockStack``'s).

  Args:
    model: the model settings (``config.model``).
    vocab_size: V.
    parts: where its attention and feed-forward kinds are looked up.

  Raises:
    errors.ConfigError: an option the family does not take or a bad value.
  """
  opts = family_options(model, "decoder_lm", DECODER_OPTIONS)
  norm = str(opts.get("norm", "layer"))
  blocks.check_norm(norm)
  return TransformerLM(
      cfg=block_stack.ModelConfig.of(model, vocab_size=vocab_size, parts=parts),
      positions=str(opts.get("positions", "sinusoid")),
      norm_kind=norm,
      tie_embeddings=bool(opts.get("tie_embeddings", True)),
      post_norms=bool(opts.get("post_norms", False)),
      local_layers=tuple(int(i) for i in opts.get("local_layers", ())),
      local_attention_options=dict(opts.get("local_attention_options", {})),
  )
