"""The normalisation kinds of a block and of a model's last hidden states.

``model.family_options.norm`` picks one for every normalisation of a
decoder LM: 'layer' (LayerNorm, scale and bias) or 'rms' (RMSNorm, a scale
only: ``x / sqrt(mean(x^2) + eps) * scale``, as Llama-family models have
it). Both are Flax's own modules, their parameters named ``scale`` (and
``bias``) with the logical axis 'embed'.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn

from memjax import errors

NORMS = ("layer", "rms")


def check_norm(kind: str) -> None:
  """Raises ConfigError unless ``kind`` is one of ``NORMS``."""
  if kind not in NORMS:
    raise errors.ConfigError(
        f"model.family_options.norm must be one of {', '.join(NORMS)}, got "
        f"{kind!r}"
    )


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
  return nn.RMSNorm(
      epsilon=epsilon,
      dtype=dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, (axis,)),
      **({} if name is None else {"name": name}),
  )
