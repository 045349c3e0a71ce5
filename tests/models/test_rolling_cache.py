"""The rolling key/value cache of a sliding-window layer
(models.rolling_cache), by hand: W = 3 slots, calls of 2, 1 and 4 rows."""

import jax.numpy as jnp
import numpy as np

from memjax.models import rolling_cache


def _rows(positions):
  """[1, Q, 1, 1] keys whose value is their position."""
  return jnp.asarray(positions, jnp.float32)[None, :, None, None]


def test_positions_roll_over_the_slots_and_mask_by_position():
  cache = rolling_cache.init(1, 3, 1, 1, jnp.float32)
  assert rolling_cache.is_rolling(cache) and not rolling_cache.is_rolling(
      cache[:2]
  )
  # Positions 0, 1: nothing kept before; causal within the call.
  k, _, keep, cache = rolling_cache.extend(
      cache, _rows([0, 1]), _rows([0, 1]), jnp.int32(0), None, 3
  )
  np.testing.assert_array_equal(k[0, :, 0, 0], [0, 0, 0, 0, 1])
  np.testing.assert_array_equal(keep[0, 0], [[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])
  np.testing.assert_array_equal(cache[2][0], [0, 1, -1])
  # Position 2 reads 0, 1 and itself.
  _, _, keep, cache = rolling_cache.extend(
      cache, _rows([2]), _rows([2]), jnp.int32(2), None, 3
  )
  np.testing.assert_array_equal(keep[0, 0], [[1, 1, 0, 1]])
  np.testing.assert_array_equal(cache[2][0], [0, 1, 2])
  # Positions 3..6: the window of 3 (position 6 reads 4, 5, 6); the kept
  # rows are 4, 5, 6 at slots 1, 2, 0; a decoder mask drops position 4.
  mask = jnp.ones((1, 1, 1, 8), bool).at[..., 4].set(False)
  k, _, keep, cache = rolling_cache.extend(
      cache, _rows([3, 4, 5, 6]), _rows([3, 4, 5, 6]), jnp.int32(3), mask, 3
  )
  np.testing.assert_array_equal(k[0, :, 0, 0], [0, 1, 2, 3, 4, 5, 6])
  np.testing.assert_array_equal(
      keep[0, 0],
      [
          [0, 1, 1, 1, 0, 0, 0],
          [0, 0, 1, 1, 0, 0, 0],
          [0, 0, 0, 1, 0, 1, 0],
          [0, 0, 0, 0, 0, 1, 1],
      ],
  )
  np.testing.assert_array_equal(cache[2][0], [6, 4, 5])
  np.testing.assert_array_equal(cache[0][0, :, 0, 0], [6, 4, 5])


def test_a_call_rewriting_kept_positions_masks_their_old_rows():
  """A window run again from position 1: the kept rows of positions 1
  and 2 are stale and masked; the new ones replace them."""
  cache = rolling_cache.init(1, 3, 1, 1, jnp.float32)
  _, _, _, cache = rolling_cache.extend(
      cache, _rows([0, 1, 2]), _rows([0, 1, 2]), jnp.int32(0), None, 3
  )
  _, _, keep, cache = rolling_cache.extend(
      cache, _rows([10, 20]), _rows([10, 20]), jnp.int32(1), None, 3
  )
  np.testing.assert_array_equal(keep[0, 0], [[1, 0, 0, 1, 0], [1, 0, 0, 1, 1]])
  np.testing.assert_array_equal(cache[0][0, :, 0, 0], [0, 10, 20])
  np.testing.assert_array_equal(cache[2][0], [0, 1, 2])
