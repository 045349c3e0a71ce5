"""Encoder-decoder Transformer for translation ('encoder_decoder').

fairseq's ``transformer_iwslt_de_en`` built from the LM's parts: the
feed-forward kinds (``model.feed_forward``), the head projections and
logical axes of ``models/attention.py``, the residual block of
``models/blocks.py`` (encoder layers: self-attention and FFN; decoder
layers: causal self-attention, cross-attention over the encoder output and
FFN; ``norm_position`` 'post' is fairseq's default
``normalize_before=False``; 'pre' adds a final LayerNorm to the stack).
Each stack may take its own position (``family_options``
``encoder_norm_position`` / ``decoder_norm_position``, fairseq's
``--encoder-normalize-before`` / ``--decoder-normalize-before``): the
authors' TRIMEMT_ext is a post-LN encoder under a pre-LN decoder.
Token embeddings are scaled by sqrt(D) plus sinusoid positions; the decoder's
input embedding is its output projection (``share_decoder_input_output_embed``).

The model is a pure function of (params, source, decoder inputs):
``model(inputs, targets, source=...)`` scores a batch for training, and
``encode`` / ``init_cache`` / ``decode_step`` run the decoder one token at a
time with cached self-attention keys and values (``memjax.translation``).
Its output carries g, the last decoder layer's feed-forward input (TRIME's
memory key), for the memory of the MT variant.
"""

from __future__ import annotations

from typing import Any, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.models import adaptive
from memjax.models import block_stack
from memjax.models import blocks
from memjax.models import stack
from memjax.models import transformer

Array = jax.Array


@flax.struct.dataclass
class Seq2SeqOutput(transformer.LMOutput):
  """What the encoder-decoder returns for a batch: ``LMOutput``'s fields,
  and what label smoothing needs.

  Attributes:
    target_logprob: [B, T] float32 log p(target) (None without targets).
    log_z: [B, T] float32 log-normaliser of the softmax.
    features: [B, T, D] g, the last decoder layer's feed-forward input (or
        ``hidden``, with ``memory_feature='final_output'``).
    hidden: [B, T, D] the decoder's final hidden states.
    memory: always None (no recurrence; kept for the train step).
    mean_logprob: [B, T] float32 mean over the vocabulary of log p (the
        uniform part of label smoothing), None without targets.
    vocab_size: V (static).
  """

  mean_logprob: Optional[Array] = None
  vocab_size: int = flax.struct.field(pytree_node=False, default=0)


class EncoderDecoder(block_stack.BlockStack):
  """The translation Transformer (see the module docstring).

  Attributes (besides ``block_stack.BlockStack``'s ``cfg``, whose
  ``num_layers`` is the decoder's depth, ``vocab_size`` the joint
  vocabulary's with pad id 0 and ``max_len`` the longest sentence):
    encoder_layers: the encoder's depth.
    memory_feature: what g is (the key of TRIMEMT_ext's in-batch memory, its
      datastore and its decoding, all read from ``features`` / the g of
      ``decode_step``): 'last_ffn_input', the last decoder layer's
      feed-forward input (the paper's text), or 'final_output', the
      decoder's final output after its last LayerNorm (the authors'
      ``knn_embed``, princeton-nlp/TRIME machine_translation/fairseq/models/
      transformer.py 1116-1125, also saved by ``save_datastore.py`` 139).
    encoder_norm_position, decoder_norm_position: 'pre' or 'post' for that
      stack's blocks (and its final LayerNorm, with 'pre'); '' = the
      model's ``norm_position``.
  """

  encoder_layers: int = 2
  memory_feature: str = "last_ffn_input"
  encoder_norm_position: str = ""
  decoder_norm_position: str = ""

  def setup(self):
    # The norm positions are checked once: model.norm_position by
    # build.check, the stacks' by encoder_decoder.
    emb_init = nn.initializers.normal(self.cfg.d_model**-0.5)
    self.src_embed = self.table(
        "source_embedding", emb_init, self.cfg.vocab_size
    )
    self.tgt_embed = self.table(
        "target_embedding", emb_init, self.cfg.vocab_size
    )
    encoder, decoder = self.stacks()
    self.encoder = self.make_stack(encoder, self.masked_attention())
    cross = self.plain_attention()
    self.decoder = self.make_stack(
        decoder, self.masked_attention(causal=True), lambda layer: cross
    )
    pre = {k: v == "pre" for k, v in self._stack_norms().items()}
    self.encoder_norm = self.norm("encoder_norm") if pre["encoder"] else None
    self.decoder_norm = self.norm("decoder_norm") if pre["decoder"] else None
    self.drop = nn.Dropout(self.cfg.dropout)

  def _stack_norms(self) -> dict[str, str]:
    """{'encoder': its norm position, 'decoder': its}."""
    return {
        "encoder": self.encoder_norm_position or self.cfg.norm_position,
        "decoder": self.decoder_norm_position or self.cfg.norm_position,
    }

  def make_block(
      self,
      name: str,
      layer: int,
      attention: blocks.Sublayer,
      *,
      cross: Optional[blocks.Sublayer] = None,
  ) -> blocks.ResidualBlock:
    """``BlockStack.make_block`` with the norm position of the block's stack
    (its name is ``encoder_<i>`` or ``decoder_<i>``)."""
    return self.block_class()(
        attention=attention,
        feed_forward=self.feed_forward_sublayer(layer),
        cross=cross,
        name=name,
        norm_position=self._stack_norms()[name.split("_")[0]],
        norm_epsilon=self.cfg.norm_epsilon,
        dropout_rate=self.cfg.dropout,
        dtype=self.cfg.compute_dtype,
    )

  def stacks(self) -> tuple[list[stack.LayerRun], list[stack.LayerRun]]:
    """The runs of the encoder's blocks and the decoder's (unbound too)."""
    cross = lambda layer: self.plain_attention()
    return (
        self.stack_runs("encoder", self.encoder_layers),
        self.stack_runs("decoder", self.cfg.num_layers, cross),
    )

  def layer_runs(self) -> list[stack.LayerRun]:
    """The runs of both stacks."""
    encoder, decoder = self.stacks()
    return encoder + decoder

  # -- pieces ----------------------------------------------------------------

  def _embed(self, table: Array, ids: Array, offset: Any, deterministic: bool):
    t = ids.shape[1]
    if t > self.cfg.max_len:
      raise errors.ConfigError(
          f"sentence length {t} exceeds model.max_len {self.cfg.max_len}"
      )
    x = (
        jnp.take(table, ids, axis=0).astype(self.cfg.compute_dtype)
        * self.cfg.d_model**0.5
    )
    if (
        self.cfg.attention_kind.ABSOLUTE_POSITIONS
    ):  # A relative kind has its own.
      pos = block_stack.sinusoid_table(self.cfg.max_len, self.cfg.d_model)
      pos = jax.lax.dynamic_slice_in_dim(jnp.asarray(pos), offset, t, axis=0)
      x = x + pos[None].astype(self.cfg.compute_dtype)
    x = self.drop(x, deterministic=deterministic)
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))

  def encode(
      self, source: Array, *, deterministic: bool = True
  ) -> tuple[Array, Array]:
    """[B, S] source ids (0 = padding) -> ([B, S, D] states, [B, S] mask)."""
    mask = source != 0
    x = self._embed(self.src_embed, source, 0, deterministic)
    self_mask = mask[:, None, None, :]
    x, _, _ = stack.apply(
        self.encoder, x, None, deterministic, attend_inputs={"mask": self_mask}
    )
    if self.encoder_norm is not None:
      x = self.encoder_norm(x)
    return x, mask

  def cross_kv(self, enc: Array) -> tuple[tuple[Array, Array], ...]:
    """Every decoder layer's cross-attention keys and values of ``enc``."""
    out = []
    for run, block in self.decoder:
      if not run.scanned:
        out.append(block.cross_kv(enc))
        continue
      body = lambda blk, carry, xs, source: (carry, blk.cross_kv(source))
      _, kvs = stack.scan(run, block, body, None, None, enc)
      out.extend(stack.unstack_tree(kvs, run.count))
    return tuple(out)

  def _memory_g(self, ffn_input: Array, hidden: Array) -> Array:
    """g per ``memory_feature``: [B, T, D] of either source."""
    if self.memory_feature == "last_ffn_input":
      return ffn_input
    if self.memory_feature == "final_output":
      return hidden
    raise errors.ConfigError(
        "model.family_options.memory_feature must be 'last_ffn_input' or "
        f"'final_output', got {self.memory_feature!r}"
    )

  def _decoder_out(
      self, h: Array, dtype: Any = jnp.float32
  ) -> tuple[Array, Array]:
    """Final hidden -> (hidden, [.., V] logits of the tied output in
    ``dtype``: float32, or a narrower compute dtype whose statistics
    ``adaptive.narrow_log_softmax_stats`` takes without a float32 [.., V]
    buffer)."""
    if self.decoder_norm is not None:
      h = self.decoder_norm(h)
    logits = jnp.einsum(
        "...d,vd->...v", h.astype(dtype), self.tgt_embed.astype(dtype)
    )
    return h, nn.with_logical_constraint(logits, ("batch", "length", "vocab"))

  def forward(
      self,
      inputs: Array,
      targets: Optional[Array],
      deterministic: bool,
      source: Optional[Array] = None,
  ) -> Seq2SeqOutput:
    """Scores a batch of pairs by teacher forcing (``model(inputs, targets,
    source=source)``).

    Args:
      inputs: [B, T] decoder inputs (start id 0, then the target shifted).
      targets: [B, T] target ids (0 = padding), or None.
      deterministic: disables dropout.
      source: [B, S] source ids (0 = padding); None stands the inputs in
        (shape inference at initialisation).

    Returns:
      A ``Seq2SeqOutput`` over the T target positions.
    """
    source = inputs if source is None else source
    enc, src_mask = self.encode(source, deterministic=deterministic)
    x = self._embed(self.tgt_embed, inputs, 0, deterministic)
    t = inputs.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))[None, None]
    kvs = [{"kv": kv} for kv in self.cross_kv(enc)]
    x, g, _ = stack.apply(
        self.decoder,
        x,
        None,
        deterministic,
        layer_cross=kvs,
        attend_inputs={"mask": causal},
        cross_inputs={"mask": src_mask[:, None, None, :]},
    )
    narrow = jnp.dtype(self.cfg.compute_dtype) != jnp.float32
    if targets is not None and narrow:
      hidden, logits = self._decoder_out(x, self.cfg.compute_dtype)
      g = self._memory_g(g, hidden)
      lp, log_z, mean = adaptive.narrow_log_softmax_stats(logits, targets)
      return Seq2SeqOutput(
          lp, log_z, g, hidden, None, mean, self.cfg.vocab_size
      )
    hidden, logits = self._decoder_out(x)
    g = self._memory_g(g, hidden)
    if targets is None:
      return Seq2SeqOutput(None, None, g, hidden)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    mean = jnp.mean(logits, axis=-1) - log_z
    return Seq2SeqOutput(
        tgt - log_z, log_z, g, hidden, None, mean, self.cfg.vocab_size
    )

  # -- incremental decoding ----------------------------------------------------

  def init_cache(self, enc: Array, max_len: int) -> dict[str, Any]:
    """The decoding cache of a batch: the cross keys/values of ``enc`` and
    empty self-attention keys/values [B, max_len, H, d_h] per layer."""
    b = enc.shape[0]
    zeros = jnp.zeros(
        (b, max_len, self.cfg.num_heads, self.cfg.head_dim),
        self.cfg.compute_dtype,
    )
    return {
        "cross": self.cross_kv(enc),
        "self": tuple((zeros, zeros) for _ in range(self.cfg.num_layers)),
    }

  def decode_step(
      self,
      token: Array,
      pos: Array,
      cache: dict[str, Any],
      src_mask: Array,
      with_log_z: bool = False,
  ) -> tuple[Any, ...]:
    """One decoder step for N rows.

    Args:
      token: [N] int32 the input token at position ``pos``.
      pos: scalar int32.
      cache: from ``init_cache`` (or the previous step).
      src_mask: [N, S] bool real source tokens.
      with_log_z: also return the softmax's log-normaliser.

    Returns:
      ([N, V] float32 log-probabilities of the next token, [N, D] g, cache),
      then [N] float32 log_z if ``with_log_z``.
    """
    x = self._embed(self.tgt_embed, token[:, None], pos, True)
    max_len = cache["self"][0][0].shape[1]
    self_mask = (jnp.arange(max_len) <= pos)[None, None, None, :]
    x, g, new_self = stack.apply(
        self.decoder,
        x,
        cache["self"],
        True,
        layer_cross=[{"kv": kv} for kv in cache["cross"]],
        attend_inputs={"mask": self_mask, "pos": pos},
        cross_inputs={"mask": src_mask[:, None, None, :]},
    )
    hidden, logits = self._decoder_out(x[:, 0])
    g = self._memory_g(g, hidden[:, None])
    log_z = jax.nn.logsumexp(logits, axis=-1)
    new_cache = {"cross": cache["cross"], "self": tuple(new_self)}
    if with_log_z:
      return logits - log_z[:, None], g[:, 0], new_cache, log_z
    return jax.nn.log_softmax(logits, axis=-1), g[:, 0], new_cache


def encoder_decoder(
    model: settings_lib.Model, *, vocab_size: int, parts: extend.Parts
) -> EncoderDecoder:
  """The ``EncoderDecoder`` of a model's settings: ``num_layers`` decoder
  layers, ``family_options.encoder_layers`` encoder layers (default: as
  many), ``family_options.memory_feature`` and the stacks' norm positions
  ``family_options.encoder_norm_position`` / ``decoder_norm_position``
  (default: ``model.norm_position``) (``EncoderDecoder``)."""
  stack_norms = ("encoder_norm_position", "decoder_norm_position")
  opts = transformer.family_options(
      model,
      "encoder_decoder",
      ["encoder_layers", "memory_feature", *stack_norms],
  )
  for key in stack_norms:
    if opts.get(key, "") not in ("", *blocks.NORM_POSITIONS):
      raise errors.ConfigError(
          f"model.family_options.{key} must be 'pre', 'post' or '' (the "
          f"model's norm_position), got {opts[key]!r}"
      )
  defaults = extend.option_defaults(parts.attention.get(model.attention))
  changed = {
      k: v
      for k, v in dict(model.attention_options or {}).items()
      if k not in (defaults or {}) or defaults[k] != v
  }
  if changed:  # Its options at their defaults only.
    raise errors.ConfigError(
        f"model.attention_options {changed}: the "
        "encoder-decoder's attention takes no options (its decoding cache "
        "holds every head at sinusoid absolute positions)"
    )
  cfg = block_stack.ModelConfig.of(model, vocab_size=vocab_size, parts=parts)
  return EncoderDecoder(
      # Every layer of each stack uses model.feed_forward.
      cfg=cfg.replace(feed_forward_layers=()),
      encoder_layers=int(opts.get("encoder_layers", model.num_layers)),
      memory_feature=str(opts.get("memory_feature", "last_ffn_input")),
      **{key: str(opts.get(key, "")) for key in stack_norms},
  )


def flops(
    s: settings_lib.Settings, shape: extend.FlopsShape
) -> dict[str, float]:
  """FLOPs per token of the encoder-decoder beyond ``--mode=plan``'s
  formula (``extend.Method.flops``); {} for another family.

  The formula counts every parameter 6 times per target token and each
  layer's attention over the T positions. The decoder's layers also attend
  to the S source positions (scores and weighted sum, 12 S d_attn each;
  the plan's batches pad source and target to one bucket, S = T), and the
  source embedding is gathered, never multiplied (its 6 V D left out).
  """
  m = s.model
  if m.family != "encoder_decoder":
    return {}
  d_attn = int(m.num_heads) * int(m.head_dim)
  return {
      "cross-attention": 12.0 * int(m.num_layers) * shape.seq_len * d_attn,
      "source embedding gathered": -6.0 * shape.vocab_size * int(m.d_model),
  }
