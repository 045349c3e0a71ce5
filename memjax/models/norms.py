"""The normalisation kinds of a block and of a model's last hidden states.

``model.family_options.norm`` picks one for every normalisation of a
decoder LM: 'layer' (LayerNorm, scale and bias), 'rms' (RMSNorm, a scale
only: ``x / sqrt(mean(x^2) + eps) * scale``, as Llama-family models have
it) or 'rms_plus_one' (Gemma's RMSNorm: ``x / sqrt(mean(x^2) + eps) *
(1 + scale)`` in float32, its scale starting at 0). The first two are
Flax's own modules; each names its parameters ``scale`` (and ``bias``),
with the logical axis 'embed' (or another one given, as 'kv' for a head's
features).
"""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors

NORMS = ("layer", "rms", "rms_plus_one")


def check_norm(kind: str) -> None:
  """Raises ConfigError unless ``kind`` is one of ``NORMS``."""
  if kind not in NORMS:
    raise errors.ConfigError(
        f"model.family_options.norm must be one of {', '.join(NORMS)}, got "
        f"{kind!r}"
    )


class RMSNormPlusOne(nn.Module):
  """Gemma's RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * (1 +
  scale)``, computed in float32 and cast to ``dtype`` (Hugging Face's
  ``Gemma3RMSNorm``), its ``scale`` [N] starting at 0.

  Attributes:
    epsilon: added to the mean square.
    dtype: the output's dtype.
    axis: the scale's logical axis.
  """

  epsilon: float = 1e-6
  dtype: Any = jnp.float32
  axis: str = "embed"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., N] -> [..., N] normalised."""
    init = nn.with_logical_partitioning(nn.initializers.zeros, (self.axis,))
    scale = self.param("scale", init, (x.shape[-1],), jnp.float32)
    x = x.astype(jnp.float32)
    y = x * jax.lax.rsqrt(
        jnp.mean(x * x, axis=-1, keepdims=True) + self.epsilon
    )
    return (y * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)


def layer_norm(
    name: Optional[str], dtype: Any, epsilon: float = 1e-6, axis: str = "embed"
) -> nn.LayerNorm:
  """A LayerNorm over [..., D] whose scale and bias have the logical axis
  ``axis``; ``name`` None leaves the name to the parent's ``setup``."""
  return nn.LayerNorm(
      epsilon=epsilon,
      dtype=dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, (axis,)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axis,)),
      **({} if name is None else {"name": name}),
  )


def make_norm(
    kind: str,
    name: Optional[str],
    dtype: Any,
    epsilon: float = 1e-6,
    axis: str = "embed",
) -> nn.Module:
  """The normalisation ``kind`` (``NORMS``) over the last axis of [..., N],
  its parameters of logical axis ``axis`` (the model's 'embed'; 'kv' for a
  head's features); ``name`` None leaves the name to the parent's
  ``setup``.

  Raises:
    errors.ConfigError: an unknown kind.
  """
  check_norm(kind)
  if kind == "layer":
    return layer_norm(name, dtype, epsilon, axis)
  if kind == "rms_plus_one":
    named = {} if name is None else {"name": name}
    return RMSNormPlusOne(epsilon=epsilon, dtype=dtype, axis=axis, **named)
  return nn.RMSNorm(
      epsilon=epsilon,
      dtype=dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, (axis,)),
      **({} if name is None else {"name": name}),
  )
