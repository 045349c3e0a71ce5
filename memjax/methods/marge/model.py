"""Retrieval-augmented causal LM, Komatsuzaki's modified MARGE ('marge').

The decoder reads a window of two segments of N tokens, the immediate
context S_t and the segment to predict S_{t+1} (the loss covers S_{t+1}
only, through the batch's weights), and attends to K retrieved sources.

* Embedder e(.): shares the model's weights, as MARGE's does: the output of
  the first half of the layers, after a LayerNorm (``embed_norm``), pooled
  over the N positions of a segment (``pooling``: 'mean' or 'last'; the
  first position of a causal stack sees one token) and scaled to unit norm.
* Sources: each a retrieved segment followed by its continuation (2N
  tokens, RETRO's choice), encoded with the current parameters by the same
  lower half of the stack (``embed_norm`` of its output), so gradients reach
  the sources' encoding; their embedding e(source) pools the segment part.
* Cross-attention in the layers ``cross_layers`` (1-based; default the
  upper half): score(target position, source token) =
  q.k / sqrt(d_h) + beta * e(S_t).e(source), one softmax over the tokens
  of all K sources; beta is a trainable scalar. The bias uses e(S_t), the
  query that retrieved the sources, never e(S_{t+1}).

A lane with no valid source token (no retrieval, empty slots) gets a zero
cross-attention output, so with ``sources=None`` the model is the plain LM
with the same self-attention and feed-forward parameters (``retrieval
off``). The lower half has no cross-attention, so e(S_t) never depends on
the sources and the decoder's lower half is the embedder itself.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.models import attention as attention_lib
from memjax.models import blocks
from memjax.models import block_stack
from memjax.models import multihead
from memjax.models import stack
from memjax.models import transformer

Array = jax.Array
POOLINGS = ("mean", "last")
OPTIONS = (
    "segment_len",
    "num_sources",
    "cross_layers",
    "pooling",
    "beta_init",
    "embed_gradient",
)


def pool_segment(h: Array, segment_len: int, pooling: str) -> Array:
  """[..., T, D] states -> [..., D] unit vectors of positions 0..N-1."""
  seg = h[..., :segment_len, :].astype(jnp.float32)
  v = seg.mean(axis=-2) if pooling == "mean" else seg[..., -1, :]
  return v / jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True) + 1e-12)


class BiasedCrossAttention(nn.Module):
  """Cross-attention to K sources with MARGE's similarity bias, computed by
  the one attention core (``multihead.MultiHeadAttention``), whose
  parameters (query/key/value [D, H, d_h], out [H, d_h, D]) sit directly
  in this layer's scope.
  """

  d_model: int
  num_heads: int
  head_dim: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  def setup(self) -> None:
    self.core = multihead.core_of(self)
    nn.share_scope(self, self.core)

  def __call__(
      self,
      x: Array,
      state: None = None,
      *,
      deterministic: bool,
      sources: Array,
      source_mask: Array,
      bias: Array,
  ) -> tuple[Array, None]:
    """Attends from the targets to all source tokens in one softmax.

    The calling convention of a block's attention sub-layers
    (``blocks.ResidualBlock``), with no state.

    Args:
      x: [B, T, D] normalised target states.
      state: None.
      deterministic: disables dropout.
      sources: [B, K, S, D] encoded source tokens.
      source_mask: [B, K, S] bool, True = a real token.
      bias: [B, K] float32 beta * e(S_t).e(source_k).

    Returns:
      ([B, T, D], None); zero for a lane without any real source token.
    """
    del state
    b, k, s, _ = sources.shape
    kv = self.core.kv(sources.reshape(b, k * s, -1))
    token_bias = jnp.repeat(bias.astype(jnp.float32), s, axis=1)  # [B, K*S]
    y, _ = self.core(
        x,
        deterministic=deterministic,
        mask=source_mask.reshape(b, 1, 1, k * s),
        kv=kv,
        bias=token_bias[:, None, None, :],
    )
    return y, None


class MargeLM(transformer.TransformerLM):
  """The modified-MARGE LM (pre-LN, absolute positions, no recurrence).

  Attributes (besides ``TransformerLM``'s; ``cfg`` has no attention
  options, no memory and no remat):
    segment_len: N, tokens per segment.
    num_sources: K, retrieved sources per target (the batcher's k).
    cross_layers: 1-based layers with cross-attention; () = the upper half.
    pooling: 'mean' or 'last', how e(.) pools a segment's positions.
    beta_init: the initial beta.
    embed_gradient: let the bias's gradient reach e(.) (MARGE); False
      stops it there (beta still learns).
  """

  segment_len: int = 16
  num_sources: int = 4
  cross_layers: Sequence[int] = ()
  pooling: str = "mean"
  beta_init: float = 1.0
  embed_gradient: bool = True

  def setup(self):
    self._check()
    super().setup()
    self.embed_norm = self.norm("embed_norm")
    self.beta = self.param(
        "beta", nn.initializers.constant(self.beta_init), (), jnp.float32
    )

  def cross_sublayer(self, layer: int) -> Optional[blocks.Sublayer]:
    """MARGE's cross-attention in the ``cross_layers``, else None."""
    if layer + 1 not in self.cross_layer_numbers():
      return None
    return blocks.Sublayer(BiasedCrossAttention, self.attention_settings())

  def cached_decoder(self) -> Any:
    """``decoding.MargeDecoder``: windows that retrieve their sources."""
    from memjax.methods.marge import decoding  # pylint: disable=g-import-not-at-top

    return decoding.MargeDecoder

  def stack_breaks(self) -> tuple[int, ...]:
    """The embedder's half and the decoder's are scanned apart."""
    return (self.half(),)

  def lower_half(self) -> list[tuple[stack.LayerRun, nn.Module]]:
    """(run, block) of the embedder's layers."""
    return [rb for rb in self.blocks if rb[0].first < self.half()]

  def half(self) -> int:
    """Layers of the embedder (the lower half, at least one)."""
    return max(1, self.cfg.num_layers // 2)

  def cross_layer_numbers(self) -> tuple[int, ...]:
    """1-based layers with cross-attention."""
    return tuple(self.cross_layers) or tuple(
        range(self.half() + 1, self.cfg.num_layers + 1)
    )

  def _check(self) -> None:
    if self.cfg.num_layers < 2:
      raise errors.ConfigError("model 'marge' needs model.num_layers >= 2")
    if self.pooling not in POOLINGS:
      raise errors.ConfigError(
          f"model.family_options.pooling must be one of {POOLINGS}, got "
          f"{self.pooling!r}"
      )
    bad = [
        n
        for n in self.cross_layer_numbers()
        if not self.half() < n <= self.cfg.num_layers
    ]
    if bad:
      raise errors.ConfigError(
          f"model.family_options.cross_layers {bad} must lie in the upper "
          f"half, {self.half() + 1}..{self.cfg.num_layers} (the lower half is "
          "the embedder)"
      )
    if self.cfg.norm_position != "pre":
      raise errors.ConfigError("model 'marge' takes model.norm_position 'pre'")
    if self.segment_len < 1 or 2 * self.segment_len > self.cfg.max_len:
      raise errors.ConfigError(
          f"model.family_options.segment_len {self.segment_len} must be "
          f"positive and 2N must fit model.max_len {self.cfg.max_len}"
      )

  def _lower(self, tokens: Array, deterministic: bool) -> Array:
    """[B, T] ids -> [B, T, D] output of the lower half (un-normalised)."""
    h = self.embed(tokens, deterministic)
    return stack.apply(self.lower_half(), h, None, deterministic)[0]

  def embed_segments(self, tokens: Array) -> Array:
    """e(.): [..., N] segment ids -> [..., D] float32 unit vectors."""
    lead = tokens.shape[:-1]
    h = self._lower(tokens.reshape(-1, tokens.shape[-1]), True)
    e = pool_segment(self.embed_norm(h), self.segment_len, self.pooling)
    return e.reshape(lead + e.shape[-1:])

  def encode_sources(
      self, sources: Array, deterministic: bool = True
  ) -> tuple[Array, Array]:
    """[B, K, S] ids -> ([B, K, S, D] encoded tokens, [B, K, D] e(source))."""
    b, k, s = sources.shape
    h = self.embed_norm(self._lower(sources.reshape(b * k, s), deterministic))
    e = pool_segment(h, self.segment_len, self.pooling)
    return h.reshape(b, k, s, -1), e.reshape(b, k, -1)

  def similarity_bias(self, e_query: Array, e_sources: Array) -> Array:
    """[B, D], [B, K, D] -> [B, K] beta * e(S_t).e(source)."""
    if not self.embed_gradient:
      e_query = jax.lax.stop_gradient(e_query)
      e_sources = jax.lax.stop_gradient(e_sources)
    return self.beta * jnp.einsum("bd,bkd->bk", e_query, e_sources)

  def forward(
      self,
      inputs: Array,
      targets: Optional[Array],
      deterministic: bool,
      *,
      sources: Optional[Array] = None,
      source_mask: Optional[Array] = None,
  ) -> transformer.LMOutput:
    """Scores a window S_t S_{t+1} given retrieved sources
    (``model(inputs, targets, sources=..., source_mask=...)``).

    Args:
      inputs: [B, T] ids; positions 0..N-1 are S_t (the query).
      targets: [B, T] next-token ids, or None.
      deterministic: disables dropout.
      sources: [B, K, S] source ids (segment + continuation), or None
        (retrieval off).
      source_mask: [B, K, S] bool, True = a real source token.

    Returns:
      An ``LMOutput`` over the T positions (memory None).
    """
    b = inputs.shape[0]
    h = self._lower(inputs, deterministic)
    if sources is None:
      sources = jnp.zeros((b, 1, 2 * self.segment_len), jnp.int32)
      source_mask = jnp.zeros(sources.shape, bool)
    enc, e_src = self.encode_sources(sources, deterministic)
    e_query = pool_segment(self.embed_norm(h), self.segment_len, self.pooling)
    bias = self.similarity_bias(e_query, e_src)
    cross = dict(sources=enc, source_mask=source_mask, bias=bias)
    upper = [rb for rb in self.blocks if rb[0].first >= self.half()]
    h, g, _ = stack.apply(upper, h, None, deterministic, cross_inputs=cross)
    hidden = self.final_norm(h) if self.final_norm else h
    if targets is None:
      return transformer.LMOutput(None, None, g, hidden, None)
    logp, log_z = self.embedder.score(hidden, targets, deterministic)
    return transformer.LMOutput(logp, log_z, g, hidden, None)


def marge_lm(
    model: settings_lib.Model, *, vocab_size: int, parts: extend.Parts
) -> MargeLM:
  """The ``MargeLM`` of a model's settings (``family_options``:
  segment_len, num_sources, cross_layers, pooling, beta_init,
  embed_gradient).

  The attention takes no options and no memory, and no block is
  rematerialised.
  """
  opts = transformer.family_options(model, "marge", OPTIONS)
  if "cross_layers" in opts:
    opts["cross_layers"] = tuple(opts["cross_layers"])
  cfg = block_stack.ModelConfig.of(model, vocab_size=vocab_size, parts=parts)
  cfg = cfg.replace(attention_options={}, mem_len=0, remat=False)
  return MargeLM(cfg=cfg, **opts)


# The batch arrays the model takes besides inputs and targets; the plain
# attention, whose absolute positions the retrieval's windows are built on.
FAMILY = extend.Family(
    marge_lm,
    extra_inputs=("sources", "source_mask"),
    refuses_attention=attention_lib.plain_only(
        "MARGE's decoder and its cross-attention to the retrieved sources "
        "are built on the plain attention"
    ),
)
