"""Evaluation's windows as a decoder keeps them (models.decode_windows),
against data.windows.eval_windows, which evaluation scores in."""

import jax.numpy as jnp
import numpy as np
import pytest

from memjax import errors
from memjax.data import windows as data_windows
from memjax.models import decode_windows


@pytest.mark.parametrize("t, s", [(8, 3), (8, 8), (5, 1)])
def test_a_window_slides_where_evaluation_starts_scoring_one(t, s):
  """Prediction p starts a window exactly where evaluation's window after
  the first scores its first prediction; that window starts T - S
  earlier, and its tokens are the stream's (BOS first)."""
  n, offset = 40, 3  # Predictions; stream token 0 sits at slot 3.
  w = decode_windows.Windows(t, s, bos=99)
  stream = np.arange(100, 100 + n + 1)
  g = jnp.zeros((1, offset + n + 1, 0), jnp.float32)
  tokens = np.zeros((1, offset + n + 1), np.int32)
  tokens[0, offset:] = stream
  context = w.init_context(
      g, jnp.asarray(tokens), jnp.asarray([n + 1]), offset + n + 1
  )
  rows = data_windows.eval_windows(n, t, s)
  starts = {int(a + f): int(a) for a, _, f in rows[1:]}
  for p in range(n):
    slides = bool(w.slides(context, jnp.int32(offset + p))[0])
    assert slides == (p in starts), p
    if slides:
      got, start = w.window_tokens(context, 0, jnp.int32(offset + p))
      assert int(start) == starts[p]
      want = stream[starts[p] : p + 1].copy()
      want[0] = 99
      np.testing.assert_array_equal(np.asarray(got), want)


def test_a_window_must_score_between_one_and_all_its_predictions():
  with pytest.raises(errors.ConfigError, match="eval.score_len"):
    decode_windows.Windows(8, 9)
  with pytest.raises(errors.ConfigError, match="eval.score_len"):
    decode_windows.Windows(8, 0)
