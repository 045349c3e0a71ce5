"""memjax.pretrained.hf_config: reading a config.json."""

import math

import pytest

from memjax import errors
from memjax.pretrained import hf_config


def test_rope_options_read_both_config_formats():
  scaling = {
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192,
  }
  want = {
      "rope_theta": 500000.0,
      "rope_scaling_factor": 8.0,
      "rope_low_freq_factor": 1.0,
      "rope_high_freq_factor": 4.0,
      "rope_original_max_len": 8192,
  }
  # Before transformers 5: rope_theta and rope_scaling ("type" or
  # "rope_type"); from 5 on: rope_parameters.
  old = {"rope_theta": 500000.0, "rope_scaling": dict(scaling, type="llama3")}
  new = {"rope_parameters": dict(scaling, rope_type="llama3", rope_theta=5e5)}
  assert hf_config.rope_options(old) == want
  assert hf_config.rope_options(new) == want
  assert hf_config.rope_options({}) == {"rope_theta": 10000.0}
  assert hf_config.rope_options({"rope_scaling": None, "rope_theta": 1e6}) == {
      "rope_theta": 1e6
  }
  linear = {"rope_theta": 1e4, "rope_scaling_factor": 8.0}
  linear["rope_scaling_type"] = "linear"
  old = {"rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 8}}
  new = {"rope_parameters": {"rope_type": "linear", "factor": 8.0}}
  assert hf_config.rope_options(old) == linear
  assert hf_config.rope_options(new) == linear


def test_yarn_as_hugging_face_reads_it():
  rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
  hf = {"max_position_embeddings": 8192}
  want = {
      "rope_theta": 1e4,
      "rope_scaling_factor": 4.0,
      "rope_scaling_type": "yarn",
      # No original length: max_position_embeddings.
      "rope_original_max_len": 8192,
      "rope_beta_fast": 32.0,
      "rope_beta_slow": 1.0,
      "rope_truncate": True,
      # 0.1 ln(4) + 1.
      "rope_attention_factor": 1.1386294361119890,
  }
  got = hf_config.rope_options(dict(hf, rope_parameters=rope))
  factor = got.pop("rope_attention_factor")
  assert factor == pytest.approx(want.pop("rope_attention_factor"), rel=1e-15)
  assert got == want
  rope.update(original_max_position_embeddings=2048, beta_fast=16)
  got = hf_config.rope_options(dict(hf, rope_parameters=rope))
  assert got["rope_original_max_len"] == 2048
  assert got["rope_beta_fast"] == 16.0
  # The factor left out: the lengths' ratio; mscale / mscale_all_dim.
  rope = dict(rope, factor=None, mscale=2.0, mscale_all_dim=1.0)
  got = hf_config.rope_options(dict(hf, rope_parameters=rope))
  assert got["rope_scaling_factor"] == 4.0
  ratio = (0.2 * math.log(4) + 1) / (0.1 * math.log(4) + 1)
  assert got["rope_attention_factor"] == pytest.approx(ratio, rel=1e-15)


@pytest.mark.parametrize(
    "rope, message",
    [
        ({"rope_type": "longrope", "factor": 2.0}, "type 'longrope' is not"),
        ({"rope_type": "dynamic", "factor": 2.0}, "'linear', 'llama3', 'yarn'"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
        ({"rope_type": "linear"}, "config.json has no factor"),
    ],
)
def test_unsupported_rope_is_one_line(rope, message):
  with pytest.raises(errors.DataError, match=message):
    hf_config.rope_options({"rope_parameters": rope})


def test_activations_and_keys():
  assert hf_config.activation("gelu_pytorch_tanh") == "gelu_tanh"
  with pytest.raises(errors.DataError, match="activation 'quick_gelu'"):
    hf_config.activation("quick_gelu")
  assert hf_config.get({"a": None}, "a", 3) == 3
  with pytest.raises(errors.DataError, match="config.json has no a"):
    hf_config.get({"a": None}, "a")
