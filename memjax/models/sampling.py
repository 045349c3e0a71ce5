"""How a decoder chooses the next token: greedy, or temperature, top-k and
top-p (nucleus) filtering (Holtzman et al. 2020) of the log-probabilities.

Shared by key/value-cache decoding (``lm_decoding``) and decoding by
segments (``segment_decoding``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from memjax import errors

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How a token is chosen: greedy (argmax), else temperature, then top-k
  (0 = off) and top-p filtering of the log-probabilities."""

  greedy: bool = False
  top_k: int = 0
  top_p: float = 1.0
  temperature: float = 1.0

  def check(self, where: str = "") -> None:
    """Raises errors.ConfigError on a value out of range, naming it with
    the prefix ``where`` ('generate.': the config's keys)."""
    if not 0.0 < self.top_p <= 1.0:
      raise errors.ConfigError(
          f"{where}top_p must be in (0, 1], got {self.top_p}"
      )
    if self.temperature <= 0:
      raise errors.ConfigError(
          f"{where}temperature must be > 0, got {self.temperature}"
      )
    if self.top_k < 0:
      raise errors.ConfigError(f"{where}top_k must be >= 0, got {self.top_k}")

  def choose(self, logp: Array, keys: Array) -> Array:
    """[B, V] log-probabilities, [B] keys -> [B] int32 tokens."""
    if self.greedy:
      return jnp.argmax(logp, axis=-1).astype(jnp.int32)
    logits = logp / self.temperature
    if self.top_k:
      kth = jax.lax.top_k(logits, self.top_k)[0][..., -1:]
      logits = jnp.where(logits < kth, -jnp.inf, logits)
    logits = top_p_filter(logits, self.top_p)
    return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)


def top_p_filter(logits: Array, top_p: float) -> Array:
  """Keeps the smallest set of tokens whose probability reaches ``top_p``.

  Tokens are ranked by probability; a token is kept when the probability of
  the tokens ranked before it is below ``top_p`` (so the most likely token is
  always kept, and the set is the shortest prefix whose mass is >= top_p;
  tokens tied with its last are kept too). Found without sorting: the
  threshold is bisected over the logits' range (``THRESHOLD_STEPS`` halvings,
  to float32 resolution), the largest whose tokens' mass reaches top_p.

  Args:
    logits: [..., V] float.
    top_p: in (0, 1]; 1 keeps every token.

  Returns:
    [..., V] float32 logits with -inf outside the set.
  """
  if not 0.0 < top_p <= 1.0:
    raise errors.ConfigError(f"generate.top_p must be in (0, 1], got {top_p}")
  logits = jnp.asarray(logits, jnp.float32)
  if top_p == 1.0:
    return logits
  probs = jax.nn.softmax(logits, axis=-1)
  finite = jnp.isfinite(logits)
  lo = jnp.where(finite, logits, jnp.inf).min(axis=-1, keepdims=True)
  hi = jnp.where(finite, logits, -jnp.inf).max(axis=-1, keepdims=True) + 1.0

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) / 2
    mass = jnp.where(logits >= mid, probs, 0.0).sum(axis=-1, keepdims=True)
    ok = mass >= top_p
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  lo, _ = jax.lax.fori_loop(0, THRESHOLD_STEPS, halve, (lo, hi))
  return jnp.where(logits >= lo, logits, -jnp.inf)


# Halvings of the top-p threshold's interval: float32 resolution over any
# range of logits a model gives.
THRESHOLD_STEPS = 64
