"""Bidirectional Transformer encoder, BERT-style ('encoder').

A stack of residual blocks (``blocks.ResidualBlock``: self-attention,
then the feed-forward kind) built from the plain attention of the one core
(``BlockStack.masked_attention``, bidirectional under the padding mask:
the 'vanilla' kind with its options, or the 'rpe' kind's relative
positions in place of the learned table) and the feed-forward kinds: ``model.feed_forward`` at
the 1-based layers ``model.feed_forward_layers`` (e.g. product-key memory
'pkm' or residual memory 'resm' at layers 4 and 8 of 12, Kim & Jung), the
plain 'ffn' elsewhere. As BERT: learned absolute positions, an embedding
LayerNorm, post-LN blocks (``model.norm_position='post'``). Every position attends to every real (non-padding, id 0)
position; padding positions read no memory slot (the memory kinds take the
mask), so padding never changes the outputs at real positions.

Two heads (``model.family_options.head``):

* ``mlm``: masked-LM scores. dense + ``model.activation`` + LayerNorm,
  then the tied token embedding plus a bias (the feed-forward's and the
  head's nonlinearity are one, as in Google's BERT and HuggingFace's
  ``BertPredictionHeadTransform``: both take ``hidden_act``); ``target_logprob`` [B, T] of the original tokens
  (the batch's weights keep the masked positions only).
* ``classify``: sentence classification from the first position ([CLS]):
  dense + tanh (BERT's pooler), dropout, dense to ``num_classes``;
  ``target_logprob`` [B, 1] of the label in ``targets[:, 0]`` and
  ``logits`` [B, C].

Parameter names are the same under both heads (``embedding``,
``positions``, ``embed_norm``, ``layer_<i>/...``), so a classifier takes
every encoder parameter of a pretrained MLM by ``train.init_from``.
"""

from __future__ import annotations

from typing import Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.models import block_stack
from memjax.models import feed_forward as feed_forward_lib
from memjax.models import stack
from memjax.models import transformer

Array = jax.Array
HEADS = ("mlm", "classify")


@flax.struct.dataclass
class EncoderOutput(transformer.LMOutput):
  """What the encoder returns: ``LMOutput``'s fields, and the class scores.

  Attributes:
    target_logprob: [B, T] (mlm) or [B, 1] (classify) float32 log p(target),
      None without targets.
    log_z: same shape, the softmax log-normaliser.
    features: [B, T, D] the last layer's feed-forward input.
    hidden: [B, T, D] final hidden states.
    memory: always None (no recurrence; kept for the train step).
    logits: classify: [B, C] float32 class scores; mlm: None.
  """

  logits: Optional[Array] = None


class Encoder(block_stack.BlockStack):
  """The BERT-style encoder with an MLM or a classification head.

  Attributes (besides ``block_stack.BlockStack``'s ``cfg``, whose
  ``vocab_size`` has pad id 0, ``feed_forward_kind`` is the kind at the
  1-based ``feed_forward_layers`` (() = every layer) and ``norm_position``
  is 'post' as BERT's):
    head: 'mlm' or 'classify'.
    num_classes: classify: C.
  """

  head: str = "mlm"
  num_classes: int = 2

  def setup(self):
    init = nn.initializers.normal(0.02)  # BERT's initializer_range.
    self.embedding = self.table("embedding", init, self.cfg.vocab_size)
    self.positions = None  # A relative kind has its own positions.
    if self.cfg.attention_kind.ABSOLUTE_POSITIONS:
      self.positions = self.table("positions", init, self.cfg.max_len, None)
    self.embed_norm = self.norm("embed_norm")
    attend = self.masked_attention()
    self.layers = self.make_stack(self.layer_runs(), attend)
    self.ffn_shared = self.shared_params()
    self.final_norm = (
        self.norm("final_norm") if self.cfg.norm_position == "pre" else None
    )
    self.drop = nn.Dropout(self.cfg.dropout)
    dense = lambda n, d: nn.Dense(
        d,
        dtype=self.cfg.compute_dtype,
        name=n,
        kernel_init=nn.with_logical_partitioning(init, ("embed", None)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
    )
    if self.head == "mlm":
      self.mlm_dense = dense("mlm_dense", self.cfg.d_model)
      self.mlm_norm = self.norm("mlm_norm")
      self.mlm_bias = self.param(
          "mlm_bias",
          nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
          (self.cfg.vocab_size,),
      )
    elif self.head == "classify":
      self.pooler = dense("pooler", self.cfg.d_model)
      self.classifier = dense("classifier", self.num_classes)
    else:
      raise errors.ConfigError(
          f"model.family_options.head must be one of {HEADS}, got "
          f"{self.head!r}"
      )

  # -- forward ---------------------------------------------------------------

  def encode(
      self, inputs: Array, *, deterministic: bool = True
  ) -> tuple[Array, Array, Array]:
    """[B, T] ids (0 = padding) -> ([B, T, D] hidden, [B, T, D] g, mask)."""
    t = inputs.shape[1]
    if t > self.cfg.max_len:
      raise errors.ConfigError(
          f"input length {t} exceeds model.max_len {self.cfg.max_len}"
      )
    mask = inputs != 0
    x = jnp.take(self.embedding, inputs, axis=0)
    if self.positions is not None:
      x = x + self.positions[None, :t]
    x = self.drop(
        self.embed_norm(x.astype(self.cfg.compute_dtype)),
        deterministic=deterministic,
    )
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    attend = {"mask": mask[:, None, None, :]}
    if self.ffn_shared is not None:
      shared = {"ffn_shared": self.ffn_shared()}
    else:
      shared = {}
    x, g, _ = stack.apply(
        self.layers,
        x,
        None,
        deterministic,
        mask=mask,
        attend_inputs=attend,
        **shared,
    )
    if self.final_norm is not None:
      x = self.final_norm(x)
    return x, g, mask

  def mlm_logits(self, hidden: Array) -> Array:
    """[..., D] -> [..., V] float32 scores over the vocabulary."""
    act = feed_forward_lib.activation_fn(self.cfg.activation)
    h = self.mlm_norm(act(self.mlm_dense(hidden)))
    logits = jnp.einsum(
        "...d,vd->...v",
        h.astype(jnp.float32),
        self.embedding.astype(jnp.float32),
    )
    return logits + self.mlm_bias.astype(jnp.float32)

  def class_logits(self, hidden: Array, deterministic: bool) -> Array:
    """[B, T, D] -> [B, C] float32 scores from the first position."""
    pooled = jnp.tanh(self.pooler(hidden[:, 0]))
    pooled = self.drop(pooled, deterministic=deterministic)
    return self.classifier(pooled).astype(jnp.float32)

  def forward(
      self, inputs: Array, targets: Optional[Array], deterministic: bool
  ) -> EncoderOutput:
    """Scores a batch (``model(inputs, targets)``).

    Args:
      inputs: [B, T] int32 ids (masked for MLM; 0 = padding).
      targets: mlm: [B, T] original ids; classify: [B, >=1] with the label
        in column 0; or None.
      deterministic: disables dropout.

    Returns:
      An ``EncoderOutput``.
    """
    hidden, g, _ = self.encode(inputs, deterministic=deterministic)
    if self.head == "classify":
      logits = self.class_logits(hidden, deterministic)
      if targets is None:
        return EncoderOutput(None, None, g, hidden, None, logits)
      log_z = jax.nn.logsumexp(logits, axis=-1)[:, None]
      label = jnp.clip(targets[:, :1], 0, self.num_classes - 1)
      tgt = jnp.take_along_axis(logits, label, axis=-1)
      return EncoderOutput(tgt - log_z, log_z, g, hidden, None, logits)
    if targets is None:
      return EncoderOutput(None, None, g, hidden)
    logits = self.mlm_logits(hidden)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    log_z = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return EncoderOutput(tgt - log_z, log_z, g, hidden)


def build(
    model: settings_lib.Model, *, vocab_size: int, parts: extend.Parts
) -> Encoder:
  """The ``Encoder`` of a model's settings ('encoder'); ``family_options``:
  ``head`` ('mlm' or 'classify') and ``num_classes``."""
  opts = transformer.family_options(model, "encoder", ["head", "num_classes"])
  return Encoder(
      cfg=block_stack.ModelConfig.of(model, vocab_size=vocab_size, parts=parts),
      head=str(opts.get("head", "mlm")),
      num_classes=int(opts.get("num_classes", 2)),
  )
