"""Rotary positions (RoPE; Su et al., 2021) as Llama-family models apply them.

The attention's queries and keys are rotated by their position: the head's
d_h features are two halves, and feature i of the first half and feature i
of the second are a pair turned by ``position * inv_freq[i]``, with
``inv_freq[i] = theta ** (-2 i / d_h)`` (``rope_theta``, 10,000 in the
paper, 500,000 in Llama 3). This is the "rotate half" layout of Hugging
Face's Llama and Qwen2 (their checkpoints' q/k projections are stored for
it), not the interleaved pairs of the paper.

Three rope scalings are applied to the speeds (Hugging Face's
``ROPE_INIT_FUNCTIONS``): 'linear' divides every speed by ``factor``
(positions divided by it; Gemma 3's global layers), YaRN's ('yarn',
``yarn``) slows the slow pairs only, with a ramp between, and scales the
cos and sin tables by an attention factor, and Llama 3's ('llama3')
stretches the long wavelengths for longer contexts:
wavelengths past ``original_max_len / low_freq_factor`` are slowed by
``factor``, those under ``original_max_len / high_freq_factor`` kept, and
those between interpolated (Hugging Face's ``_compute_llama3_parameters``).
The tables are computed in NumPy (float64, then float32): they depend on
the settings and the segment length only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors

Array = jax.Array

# The rope scalings (``inverse_frequencies``' ``scaling_type``).
SCALINGS = ("llama3", "linear", "yarn")


def inverse_frequencies(
    head_dim: int,
    theta: float,
    scaling_factor: float = 0.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_len: int = 8192,
    scaling_type: str = "llama3",
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> np.ndarray:
  """[d_h / 2] float64 rotation speeds, scaled if ``scaling_factor``.

  Args:
    head_dim: d_h (even).
    theta: the base (``rope_theta``).
    scaling_factor: the scaling's ``factor``; 0 = no scaling.
    low_freq_factor, high_freq_factor, original_max_len: Llama 3's
      ``low_freq_factor``, ``high_freq_factor`` and
      ``original_max_position_embeddings``.
    scaling_type: ``SCALINGS``: 'llama3', 'linear' (speeds divided by
      ``scaling_factor``; the other settings unused) or 'yarn' (``yarn``).
    beta_fast, beta_slow, truncate: YaRN's (``yarn``).

  Raises:
    errors.ConfigError: an odd d_h, a theta <= 0, an unknown scaling, or
      scaling factors that do not order the wavelengths.
  """
  if head_dim % 2 or theta <= 0:
    raise errors.ConfigError(
        f"rotary positions need an even model.head_dim and rope_theta > 0, "
        f"got {head_dim} and {theta}"
    )
  inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  if not scaling_factor:
    return inv
  if scaling_type not in SCALINGS:
    raise errors.ConfigError(
        "model.attention_options.rope_scaling_type must be one of "
        f"{', '.join(SCALINGS)}, got {scaling_type!r}"
    )
  if scaling_type == "linear":
    return inv / scaling_factor
  if scaling_type == "yarn":
    return yarn(
        inv,
        theta,
        scaling_factor,
        original_max_len,
        beta_fast,
        beta_slow,
        truncate,
    )
  if not 0 < low_freq_factor < high_freq_factor or original_max_len <= 0:
    raise errors.ConfigError(
        "model.attention_options: Llama 3 rope scaling needs 0 < "
        "rope_low_freq_factor < rope_high_freq_factor and "
        f"rope_original_max_len > 0, got {low_freq_factor}, "
        f"{high_freq_factor} and {original_max_len}"
    )
  low_wavelen = original_max_len / low_freq_factor
  high_wavelen = original_max_len / high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / scaling_factor, inv)
  smooth = (original_max_len / wavelen - low_freq_factor) / (
      high_freq_factor - low_freq_factor
  )
  smoothed = (1 - smooth) * scaled / scaling_factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, smoothed, scaled)


def yarn(
    inv: np.ndarray,
    theta: float,
    factor: float,
    original_max_len: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> np.ndarray:
  """YaRN's speeds (Peng et al., 2023; Hugging Face's
  ``_compute_yarn_parameters``): the pairs turning fewer than
  ``beta_slow`` times over ``original_max_len`` positions slowed by
  ``factor``, those turning more than ``beta_fast`` times kept, and a
  linear ramp over the pair index between.

  Args:
    inv: [d_h / 2] the unscaled speeds.
    theta, factor, original_max_len: the base, the factor, the original
      context length.
    beta_fast, beta_slow: the turns bounding the ramp.
    truncate: round the ramp's ends outwards to whole pairs.
  """
  dim = 2 * len(inv)

  def pair(turns: float) -> float:
    """The (fractional) pair index that turns ``turns`` times."""
    return (dim * math.log(original_max_len / (turns * 2 * math.pi))) / (
        2 * math.log(theta)
    )

  low, high = pair(beta_fast), pair(beta_slow)
  if truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001  # As Hugging Face's: no division by zero.
  ramp = np.clip(
      (np.arange(len(inv), dtype=np.float64) - low) / (high - low), 0, 1
  )
  return inv / factor * ramp + inv * (1 - ramp)


def tables(
    length: int, inv_freq: np.ndarray, scale: float = 1.0
) -> tuple[np.ndarray, ...]:
  """(cos, sin), each [length, d_h] float32, for positions 0..length-1,
  times ``scale`` (YaRN's attention factor; 1 otherwise)."""
  angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None]
  angles = np.concatenate([angles, angles], axis=-1)
  cos, sin = np.cos(angles) * scale, np.sin(angles) * scale
  return cos.astype(np.float32), sin.astype(np.float32)


def rotate(x: Array, cos: np.ndarray, sin: np.ndarray) -> Array:
  """Rotates x [B, T, H, d_h] by the tables [T, d_h] (in x's dtype)."""
  half = x.shape[-1] // 2
  turned = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  c = jnp.asarray(cos, x.dtype)[None, :, None]
  s = jnp.asarray(sin, x.dtype)[None, :, None]
  return x * c + turned * s


def rotate_rows(x: Array, cos: Array, sin: Array) -> Array:
  """Rotates x [B, T, H, d_h] by per-row tables [B, T, d_h] (each row's
  own positions, gathered from ``tables``)."""
  half = x.shape[-1] // 2
  turned = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  c, s = cos.astype(x.dtype)[:, :, None], sin.astype(x.dtype)[:, :, None]
  return x * c + turned * s


@dataclasses.dataclass(frozen=True)
class Rope:
  """Rotary positions' settings (``inverse_frequencies``'s arguments).

  Attributes:
    theta: the base (``rope_theta``).
    scaling_factor: the scaling's ``factor``; 0 = no scaling.
    low_freq_factor, high_freq_factor, original_max_len: Llama 3's other
      settings.
    scaling_type: 'llama3', 'linear' or 'yarn' (``SCALINGS``).
    beta_fast, beta_slow, truncate: YaRN's.
    attention_factor: the cos and sin tables' factor (YaRN's).
  """

  theta: float
  scaling_factor: float = 0.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_len: int = 8192
  scaling_type: str = "llama3"
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  truncate: bool = True
  attention_factor: float = 1.0

  def inverse_frequencies(self, head_dim: int) -> np.ndarray:
    """[d_h / 2] float64 rotation speeds (``inverse_frequencies``)."""
    return inverse_frequencies(
        head_dim,
        self.theta,
        self.scaling_factor,
        self.low_freq_factor,
        self.high_freq_factor,
        self.original_max_len,
        self.scaling_type,
        self.beta_fast,
        self.beta_slow,
        self.truncate,
    )


def rotate_qk(
    rope: "Rope",
    q: Array,
    k: Array,
    positions: Optional[Array] = None,
    table_len: int = 0,
) -> tuple[Array, Array]:
  """q, k [B, T, ., d_h] rotated by ``rope`` at positions 0..T-1, or at
  ``positions`` [B, T] int32 (each below ``table_len``: the tables are
  computed for that many positions and gathered)."""
  inv = rope.inverse_frequencies(q.shape[-1])
  length = table_len if positions is not None else q.shape[1]
  cos, sin = tables(length, inv, rope.attention_factor)
  if positions is None:
    return rotate(q, cos, sin), rotate(k, cos, sin)
  cos, sin = jnp.asarray(cos)[positions], jnp.asarray(sin)[positions]
  return rotate_rows(q, cos, sin), rotate_rows(k, cos, sin)
