"""The prompts' layout in a decoder's cache (models.decode_prompts)."""

import numpy as np
import pytest

from memjax import errors
from memjax.models import decode_prompts
from memjax.models import decode_windows
from memjax.models import transformer
from tests.models import helpers


def test_left_align_derives_positions_from_a_right_padded_mask():
  tokens = np.array([[5, 6, 0, 0], [7, 8, 9, 1]])
  mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)
  out, positions, lengths = decode_prompts.left_align(tokens, mask, 5)
  np.testing.assert_array_equal(out, [[0, 0, 0, 5, 6], [0, 7, 8, 9, 1]])
  np.testing.assert_array_equal(positions, [[0, 0, 0, 0, 1], [0, 0, 1, 2, 3]])
  np.testing.assert_array_equal(lengths, [2, 4])


def test_in_windows_a_prompt_longer_than_one_is_prefilled_to_it_and_fed():
  model = transformer.TransformerLM(cfg=helpers.tiny(32, max_len=16))
  prompts = [np.arange(1, 21), np.arange(1, 4)]
  windows = decode_windows.Windows(8, 4)
  tokens, positions, lengths, key_valid, (rest, rest_len) = (
      decode_prompts.lay_out(prompts, 30, model, windows)
  )
  np.testing.assert_array_equal(lengths, [8, 3])
  np.testing.assert_array_equal(tokens[0, -8:], np.arange(1, 9))
  np.testing.assert_array_equal(tokens[1, -3:], [1, 2, 3])
  np.testing.assert_array_equal(positions[1, -3:], [0, 1, 2])
  np.testing.assert_array_equal(rest_len, [12, 0])
  np.testing.assert_array_equal(rest[0], np.arange(9, 21))
  # 64 prompt slots, then room for the rest and 30 new tokens.
  assert tokens.shape == (2, 64) and key_valid.shape == (2, 128)
  assert key_valid[1].sum() == 128 - 61


def test_without_windows_absolute_positions_keep_a_prompts_last_tokens():
  model = transformer.TransformerLM(
      cfg=helpers.tiny(32, max_len=16), positions="learned"
  )
  tokens, _, lengths, _, _ = decode_prompts.lay_out(
      [np.arange(1, 21)], 4, model, None
  )
  assert lengths[0] == 13
  np.testing.assert_array_equal(tokens[0, -13:], np.arange(8, 21))
  with pytest.raises(errors.ConfigError, match="max_len 16"):
    decode_prompts.lay_out([np.arange(1, 21)], 17, model, None)
