"""Usage sums and metrics on hand-worked cases (Kim & Jung, section 3.2)."""

import jax.numpy as jnp
import numpy as np

from memjax.methods.pkm import counts


def test_usage_metrics_on_hand_made_patterns():
  n = 16
  uniform = counts.usage_metrics(jnp.ones(n), jnp.ones(n), jnp.full(n, 0.5))
  np.testing.assert_allclose(
      [uniform[k] for k in ("mu", "top1_mu", "kl_u", "kl_w")],
      [1.0, 1.0, 0.0, 0.0],
      atol=1e-6,
  )
  one = jnp.zeros(n).at[3].set(7.0)
  single = counts.usage_metrics(one, one, one)
  np.testing.assert_allclose(
      [single[k] for k in ("mu", "top1_mu", "kl_u", "kl_w")],
      [1 / n, 1 / n, np.log(n), np.log(n)],
      rtol=1e-6,
  )
  # Counts from reads: two positions, one head, k = 2; the second is padding.
  slots = jnp.asarray([[[2, 5]], [[2, 7]]])
  w = jnp.asarray([[[0.75, 0.25]], [[0.5, 0.5]]])
  reads, top1, wsum = counts.usage_counts(slots, w, jnp.asarray([1, 0]), 8)
  np.testing.assert_array_equal(reads, [0, 0, 1, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(top1, [0, 0, 1, 0, 0, 0, 0, 0])
  np.testing.assert_allclose(wsum, [0, 0, 0.75, 0, 0, 0.25, 0, 0])
  half = counts.usage_metrics(reads, top1, wsum)
  np.testing.assert_allclose(half["mu"], 2 / 8)
  np.testing.assert_allclose(half["kl_u"], np.log(8) - np.log(2), rtol=1e-6)


def test_top1_counts_one_per_token_and_per_head_as_a_switch():
  # One token, two heads of k = 2: head 0 reads slots 3, 5 (weights 0.6,
  # 0.4), head 1 slots 5, 1 (0.7, 0.3). Summed over heads: slot 5 has 1.1,
  # slot 3 0.6, slot 1 0.3. A second, padding token reads slot 0.
  slots = jnp.asarray([[[3, 5], [5, 1]], [[0, 2], [0, 4]]])
  w = jnp.asarray([[[0.6, 0.4], [0.7, 0.3]], [[0.5, 0.5], [0.9, 0.1]]])
  valid = jnp.asarray([1, 0])
  reads, top1, wsum = counts.usage_counts(slots, w, valid, 8)
  # Per token (the default): one top-1, slot 5, which head 0 ranks second.
  np.testing.assert_array_equal(top1, [0, 0, 0, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(reads, [0, 1, 0, 1, 0, 1, 0, 0])
  h_reads, h_top1, h_wsum = counts.usage_counts(slots, w, valid, 8, "head")
  # Per head: each head's top-1 counts, two events.
  np.testing.assert_array_equal(h_top1, [0, 0, 0, 1, 0, 1, 0, 0])
  np.testing.assert_array_equal(h_reads, [0, 1, 0, 1, 0, 2, 0, 0])
  assert float(top1.sum()) == 1 and float(h_top1.sum()) == 2
  np.testing.assert_allclose(wsum, [0, 0.3, 0, 0.6, 0, 1.1, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(h_wsum, wsum)
  # KL_u reads the per-token u': three slots read once each.
  kl_u = counts.usage_metrics(reads, top1, wsum)["kl_u"]
  np.testing.assert_allclose(kl_u, np.log(8) - np.log(3), rtol=1e-6)
