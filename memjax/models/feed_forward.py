"""Feed-forward kinds: the block's position-wise sub-layer.

A kind (``extend.FeedForward``, named by ``model.feed_forward``) is a Flax
module built with ``d_model``, ``d_ff``, ``dropout_rate``, ``dtype`` and
its options object (``options``: one frozen dataclass per kind, whose
fields are the keys of ``model.feed_forward_options``), named ``ffn``
in each block, and called as ``ffn(g [B, T, D], deterministic=...) -> [B,
T, D]``. The plain one ('ffn', ``PLAIN``) and the gated one ('glu',
``GLU``: SwiGLU with 'silu', Llama's and Qwen2's) are here; the methods
declare theirs (product-key memory).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from memjax import errors
from memjax import extend
from memjax.models import stack

Array = jax.Array

# ``model.activation``: the feed-forward's nonlinearity (and the BERT-style
# MLM head's, ``memjax.models.encoder``). 'gelu' is the exact form
# 0.5 x (1 + erf(x / sqrt(2))) (Hendrycks & Gimpel) of the PyTorch BERTs:
# HuggingFace Transformers, which Kim & Jung built on, and XLM, whose
# product-key memory they took. 'gelu_tanh' is the approximation
# 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) of Google's original
# BERT code and of GPT-2. 'silu' is x * sigmoid(x), the gate of SwiGLU
# (Shazeer, 2020) in Llama-family models.
ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "silu": nn.silu,
}


def activation_fn(activation: str) -> Callable[[Array], Array]:
  """The function of ``model.activation`` (a key of ``ACTIVATIONS``).

  Raises:
    errors.ConfigError: an unknown activation.
  """
  if activation not in ACTIVATIONS:
    raise errors.ConfigError(
        f"model.activation must be one of {', '.join(ACTIVATIONS)}, got "
        f"{activation!r}"
    )
  return ACTIVATIONS[activation]


def activation_option(
    kind: extend.FeedForward, name: str, activation: str
) -> dict[str, str]:
  """{'activation': ...} for a feed-forward kind that takes one, else {}.

  Args:
    kind: the feed-forward kind.
    name: its name (``model.feed_forward``), for messages.
    activation: ``model.activation``.

  Raises:
    errors.ConfigError: an unknown activation, or one other than relu for a
      kind without one.
  """
  activation_fn(activation)
  if kind.takes_activation:
    return {"activation": activation}
  if activation != "relu":
    raise errors.ConfigError(
        f"model.activation {activation!r}: feed-forward kind {name!r} has no "
        "activation to set"
    )
  return {}


@dataclasses.dataclass(frozen=True)
class FeedForwardOptions:
  """``model.feed_forward_options`` of the plain kind ('ffn').

  Attributes:
    activation_dropout: dropout after the activation (fairseq's
      activation_dropout); < 0 = the model's dropout.
  """

  activation_dropout: float = -1.0


class FeedForward(nn.Module):
  """Position-wise feed-forward block: D -> F -> D ('ffn'), ReLU or a GELU
  (``activation``, a key of ``ACTIVATIONS``).

  Parameters: wi {kernel [D, F] ('embed', 'mlp'), bias [F]}, wo {kernel
  [F, D] ('mlp', 'embed'), bias [D]}.
  """

  d_model: int
  d_ff: int
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  options: FeedForwardOptions = FeedForwardOptions()
  activation: str = "relu"

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
    h = ACTIVATIONS[self.activation](h)
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    h = checkpoint_name(h, stack.FFN_HIDDEN)
    rate = self.options.activation_dropout
    rate = self.dropout_rate if rate < 0 else rate
    h = nn.Dropout(rate)(h, deterministic=deterministic)
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


# The plain kind ('ffn'), which the layers outside
# ``model.feed_forward_layers`` use.
PLAIN = extend.FeedForward(FeedForward, takes_activation=True)


def _kernel(
    name: str, features: int, axes: tuple[str, str], dtype: Any
) -> nn.Dense:
  """A bias-free projection to ``features`` with logical ``axes``."""
  return nn.Dense(
      features,
      use_bias=False,
      dtype=dtype,
      name=name,
      kernel_init=nn.with_logical_partitioning(
          nn.initializers.xavier_uniform(), axes
      ),
  )


class GatedFeedForward(nn.Module):
  """A gated linear unit without biases ('glu'; Shazeer, 2020):
  ``down(act(gate(x)) * up(x))``, SwiGLU with ``activation='silu'``.

  Parameters: gate, up {kernel [D, F] ('embed', 'mlp')}, down {kernel
  [F, D] ('mlp', 'embed')}: Hugging Face Llama's gate_proj, up_proj and
  down_proj, transposed.
  """

  d_model: int
  d_ff: int
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  options: extend.NoOptions = extend.NoOptions()  # It takes none.
  activation: str = "silu"

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    """[B, T, D] -> [B, T, D]."""
    gate = _kernel("gate", self.d_ff, ("embed", "mlp"), self.dtype)
    up = _kernel("up", self.d_ff, ("embed", "mlp"), self.dtype)
    h = ACTIVATIONS[self.activation](gate(x)) * up(x)
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    h = checkpoint_name(h, stack.FFN_HIDDEN)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return _kernel("down", self.d_model, ("mlp", "embed"), self.dtype)(h)


# The gated kind ('glu').
GLU = extend.FeedForward(GatedFeedForward, takes_activation=True)


class SharedParams(nn.Module):
  """Parameters every layer of a feed-forward kind reads, created once.

  Attributes:
    specs: {name: (initializer, shape, logical axes)}.
  """

  specs: Mapping[str, tuple[Any, tuple[int, ...], tuple[Any, ...]]]

  @nn.compact
  def __call__(self) -> dict[str, Array]:
    return {
        name: self.param(
            name, nn.with_logical_partitioning(init, axes), tuple(shape)
        )
        for name, (init, shape, axes) in sorted(self.specs.items())
    }
