"""Token choice (memjax.models.sampling): the inverse-CDF draw against the
distribution it draws from, filtered tokens never drawn."""

import jax
import numpy as np

from memjax.models import sampling


def _draws(logits, n):
  keys = jax.vmap(jax.random.PRNGKey)(np.arange(n))
  rows = np.broadcast_to(np.asarray(logits, np.float32), (n, len(logits)))
  return np.asarray(jax.jit(sampling.draw)(keys, rows))


def test_draw_frequencies_follow_the_probabilities():
  # Mass spread over three blocks, with a long tail of tiny tokens.
  v = 3 * sampling.DRAW_BLOCK + 17
  probs = np.full(v, 1e-7)
  probs[[3, 700, 1100, v - 1]] = [0.4, 0.3, 0.2, 0.1]
  n = 20000
  counts = np.bincount(_draws(np.log(probs), n), minlength=v)
  want = probs / probs.sum()
  sigma = np.sqrt(n * want * (1 - want))
  for t in (3, 700, 1100, v - 1):
    assert abs(counts[t] - n * want[t]) < 4 * sigma[t], (t, counts[t])
  assert counts.sum() == n


def test_filtered_tokens_are_never_drawn():
  rng = np.random.default_rng(0)
  v = 2 * sampling.DRAW_BLOCK + 5
  logits = np.full(v, -np.inf, np.float32)
  allowed = rng.choice(v, 5, replace=False)
  logits[allowed] = rng.normal(size=5) * 10  # One nearly takes it all.
  drawn = _draws(logits, 5000)
  assert set(drawn) <= set(allowed)
  one = np.full(v, -np.inf, np.float32)
  one[v - 1] = 0.0  # The last token, alone in a padded block.
  assert set(_draws(one, 200)) == {v - 1}
