"""memjax.pretrained.hf_config: reading a config.json."""

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


@pytest.mark.parametrize(
    "rope, message",
    [
        ({"rope_type": "yarn", "factor": 2.0}, "rope type 'yarn' is not"),
        ({"rope_type": "dynamic", "factor": 2.0}, "'default', 'linear', "),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
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
