"""memjax.pretrained.families: config.json as memjax model settings."""

import pytest

from memjax import errors
from memjax.pretrained import families


def test_llama_and_qwen2_biases():
  hf = dict(
      model_type="llama",
      hidden_size=32,
      num_attention_heads=4,
      num_hidden_layers=2,
      intermediate_size=48,
      vocab_size=64,
  )
  llama = families.llama_settings(dict(hf, attention_bias=True))
  assert llama["attention_options"]["qkv_bias"] is True
  assert llama["attention_options"]["out_bias"] is True
  assert llama["attention_options"]["num_kv_heads"] == 4
  assert llama["head_dim"] == 8 and llama["family_options"]["norm"] == "rms"
  qwen = families.llama_settings(dict(hf, model_type="qwen2"))
  assert qwen["attention_options"]["qkv_bias"] is True
  assert qwen["attention_options"]["out_bias"] is False
  # Qwen3: no biases unless attention_bias (then on the output too); q/k
  # RMSNorm with the model's epsilon.
  qwen3 = families.llama_settings(
      dict(hf, model_type="qwen3", head_dim=16, rms_norm_eps=1e-5)
  )
  assert qwen3["attention_options"]["qkv_bias"] is False
  assert qwen3["attention_options"]["qk_norm"] == "rms"
  assert qwen3["attention_options"]["qk_norm_epsilon"] == 1e-5
  assert qwen3["head_dim"] == 16
  qwen3 = families.llama_settings(
      dict(hf, model_type="qwen3", attention_bias=True)
  )
  assert qwen3["attention_options"]["out_bias"] is True


def test_mistral_sliding_window():
  hf = dict(
      model_type="mistral",
      hidden_size=32,
      num_attention_heads=4,
      num_hidden_layers=2,
      intermediate_size=48,
      vocab_size=64,
  )
  got = families.llama_settings(dict(hf, sliding_window=4096))
  assert got["attention_options"]["sliding_window"] == 4096
  assert got["attention_options"]["qkv_bias"] is False
  # A null window (Mistral 7B v0.2 on) attends to every earlier position.
  got = families.llama_settings(dict(hf, sliding_window=None))
  assert "sliding_window" not in got["attention_options"]


def test_qwen_sliding_window_from_max_window_layers():
  hf = dict(
      model_type="qwen3",
      hidden_size=32,
      num_attention_heads=4,
      num_hidden_layers=4,
      intermediate_size=48,
      use_sliding_window=True,
      sliding_window=8,
      max_window_layers=2,
  )
  family = families.llama_settings(hf)["family_options"]
  # Layers 3 and 4 (1-based): from 0-based max_window_layers on.
  assert family["local_layers"] == [3, 4]
  assert family["local_attention_options"] == {"sliding_window": 8}
  # Without use_sliding_window, every layer attends to every position.
  family = families.llama_settings(dict(hf, use_sliding_window=False))
  assert "local_layers" not in family["family_options"]
  types = ["sliding_attention", "full_attention"] * 2
  family = families.llama_settings(dict(hf, layer_types=types))
  assert family["family_options"]["local_layers"] == [1, 3]


def test_unsupported_settings_are_named():
  with pytest.raises(errors.DataError, match="activation 'quick_gelu'"):
    families.gpt2_settings(
        dict(
            n_embd=8,
            n_head=2,
            n_layer=1,
            n_positions=8,
            activation_function="quick_gelu",
        )
    )
  with pytest.raises(errors.DataError, match="scale_attn_by_inverse_layer"):
    families.gpt2_settings(dict(scale_attn_by_inverse_layer_idx=True))
  with pytest.raises(errors.DataError, match="config.json has no n_embd"):
    families.gpt2_settings({})
