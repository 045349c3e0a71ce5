"""Safetensors checkpoints written in Hugging Face's layout, sharded."""

import json
import os

import ml_dtypes
import numpy as np

from memjax.pretrained import checkpoint
from memjax.pretrained import hf_writer


def test_shards_are_filled_in_order_up_to_the_limit():
  sizes = [("a", 40), ("b", 50), ("c", 30), ("d", 200), ("e", 10)]
  # 40 + 50 <= 100; + 30 passes it; d alone passes it (a shard of its own).
  assert hf_writer.plan_shards(sizes, 100) == [
      ["a", "b"],
      ["c"],
      ["d"],
      ["e"],
  ]
  assert hf_writer.plan_shards(sizes, 1000) == [["a", "b", "c", "d", "e"]]
  assert hf_writer.shard_name(0, 3) == "model-00001-of-00003.safetensors"


def _tensors():
  rng = np.random.default_rng(0)
  return {
      "model.embed.weight": rng.normal(size=(8, 4)).astype(np.float32),
      "model.norm.weight": rng.normal(size=(4,)).astype(np.float32),
      "lm_head.weight": rng.normal(size=(8, 4)).astype(ml_dtypes.bfloat16),
  }


def test_one_shard_is_model_safetensors(tmp_path):
  tensors = _tensors()
  written = hf_writer.write_checkpoint(str(tmp_path), tensors, 10**6)
  assert written == [checkpoint.SINGLE]
  assert os.listdir(tmp_path) == [checkpoint.SINGLE]
  got = checkpoint.read_tensors(str(tmp_path))
  for key, value in tensors.items():
    assert got[key].dtype == value.dtype
    np.testing.assert_array_equal(got[key], value)


def test_shards_have_an_index_that_reads_back(tmp_path):
  tensors = _tensors()
  written = hf_writer.write_checkpoint(str(tmp_path), tensors, 100)
  names = [hf_writer.shard_name(i, 2) for i in range(2)]
  assert written == names + [checkpoint.INDEX]
  with open(tmp_path / checkpoint.INDEX, encoding="utf-8") as f:
    index = json.load(f)
  # 128, 16 and 64 bytes: the embedding alone, then 16 + 64 <= 100.
  assert index["metadata"]["total_size"] == 128 + 16 + 64
  assert index["weight_map"] == {
      "model.embed.weight": names[0],
      "model.norm.weight": names[1],
      "lm_head.weight": names[1],
  }
  got = checkpoint.read_tensors(str(tmp_path))
  for key, value in tensors.items():
    np.testing.assert_array_equal(got[key], value)
