"""The BOS and EOS ids of config.json and generation_config.json."""

import json

import pytest

from memjax import errors
from memjax.pretrained import special_ids


def _folder(tmp_path, generation=None):
  if generation is not None:
    text = generation if isinstance(generation, str) else json.dumps(generation)
    (tmp_path / "generation_config.json").write_text(text)
  return str(tmp_path)


def test_ids_are_an_int_a_list_or_none():
  assert special_ids.as_ids(2) == (2,)
  assert special_ids.as_ids([128001, 128008, 128009]) == (
      128001,
      128008,
      128009,
  )
  assert special_ids.as_ids(None) == () and special_ids.as_ids([]) == ()


def test_generation_config_lists_come_first(tmp_path):
  # Llama 3 Instruct: config.json names one end token, generation_config
  # also <|eot_id|>.
  hf = {"bos_token_id": 128000, "eos_token_id": 128001}
  gen = {"bos_token_id": 128000, "eos_token_id": [128001, 128009]}
  got = special_ids.read(_folder(tmp_path, gen), hf)
  assert got == (128000, (128001, 128009))


def test_config_json_alone_keeps_every_id(tmp_path):
  hf = {"bos_token_id": [1], "eos_token_id": [2, 7]}
  assert special_ids.read(_folder(tmp_path), hf) == (1, (2, 7))
  assert special_ids.read(_folder(tmp_path), {}) == (None, ())
  # A generation_config.json naming no ids leaves config.json's.
  folder = _folder(tmp_path, {"eos_token_id": None, "do_sample": True})
  assert special_ids.read(folder, hf) == (1, (2, 7))


def test_an_unreadable_generation_config_is_one_line(tmp_path):
  with pytest.raises(errors.DataError, match="generation_config.json is not"):
    special_ids.read(_folder(tmp_path, "{oops"), {})
  with pytest.raises(errors.DataError, match="not a JSON object"):
    special_ids.read(_folder(tmp_path, "[1, 2]"), {})
