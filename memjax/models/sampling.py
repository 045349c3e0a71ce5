"""How a decoder chooses the next token: greedy, or temperature, top-k and
top-p (nucleus) filtering (Holtzman et al. 2020) of the log-probabilities.

Used by key/value-cache decoding (``lm_decoding``).
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
    return draw(keys, top_p_filter(logits, self.top_p))


# Tokens per block of ``draw``'s two-level inverse CDF.
DRAW_BLOCK = 512


def _last_positive(x: Array) -> Array:
  """[B, N] >= 0 -> [B] int32 the index of each row's last positive entry
  (0 for a row without one)."""
  n = x.shape[-1]
  flipped = jnp.argmax(x[:, ::-1] > 0, axis=-1)
  return jnp.where(jnp.any(x > 0, axis=-1), n - 1 - flipped, 0).astype(
      jnp.int32
  )


def draw(keys: Array, logits: Array) -> Array:
  """One token per row drawn from softmax(logits), by inverse CDF.

  Written here rather than ``jax.random.categorical`` because that draws a
  Gumbel variate for every vocabulary entry (two logarithms each): 7.2 ms
  per row over a 267,735-word vocabulary on a 2-core CPU, more than a
  cached step's model. This draws one uniform u per row, finds the block
  of ``DRAW_BLOCK`` tokens where the cumulative mass passes u, then the
  token in it: two short cumulative sums, 0.25 ms. A token of zero
  probability (logit -inf) is never drawn, whatever the rounding.

  Args:
    keys: [B] PRNG keys.
    logits: [B, V] float, -inf for tokens that may not be drawn (at least
      one finite per row).

  Returns:
    [B] int32 tokens.
  """
  b, v = logits.shape
  logits = jnp.asarray(logits, jnp.float32)
  probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  blocks = jnp.pad(probs, ((0, 0), (0, (-v) % DRAW_BLOCK)))
  blocks = blocks.reshape(b, -1, DRAW_BLOCK)
  mass = blocks.sum(axis=-1)  # [B, blocks]
  upto = jnp.cumsum(mass, axis=-1)
  u = jax.vmap(jax.random.uniform)(keys) * upto[:, -1]
  j = jnp.minimum(jnp.sum(upto <= u[:, None], -1), _last_positive(mass))
  pick = lambda x: jnp.take_along_axis(x, j[:, None], axis=1)[:, 0]  # noqa: E731
  row = jnp.take_along_axis(blocks, j[:, None, None], axis=1)[:, 0]
  rest = u - (pick(upto) - pick(mass))
  i = jnp.sum(jnp.cumsum(row, axis=-1) <= rest[:, None], -1)
  return (j * DRAW_BLOCK + jnp.minimum(i, _last_positive(row))).astype(
      jnp.int32
  )


def top_p_filter(logits: Array, top_p: float) -> Array:
  """Keeps the smallest set of tokens whose probability reaches ``top_p``.

  Tokens are ranked by probability; a token is kept when the probability of
  the tokens ranked before it is below ``top_p`` (so the most likely token is
  always kept, and the set is the shortest prefix whose mass is >= top_p;
  tokens tied with its last are kept too). Found without sorting: the
  threshold is bisected over the logits' range, to float32 resolution (at
  most ``THRESHOLD_STEPS`` halvings), the largest whose tokens' mass reaches
  top_p.

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

  def halve(state):
    step, lo, hi = state
    mid = lo + (hi - lo) / 2
    mass = jnp.where(logits >= mid, probs, 0.0).sum(axis=-1, keepdims=True)
    ok = mass >= top_p
    return step + 1, jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  def splittable(state):
    # Once no float32 lies strictly between lo and hi, lo stays as it is:
    # the halvings stop there (about 30 for a model's logits, not 64).
    step, lo, hi = state
    mid = lo + (hi - lo) / 2
    return (step < THRESHOLD_STEPS) & jnp.any((mid > lo) & (mid < hi))

  _, lo, _ = jax.lax.while_loop(splittable, halve, (0, lo, hi))
  return jnp.where(logits >= lo, logits, -jnp.inf)


# Halvings of the top-p threshold's interval, at most: float32 resolution
# over any range of logits a model gives.
THRESHOLD_STEPS = 64
