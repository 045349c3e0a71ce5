"""memjax.pretrained.gemma: Gemma 3's config.json in both formats.

The fixtures' config.json files are transformers 5's (``layer_types``,
``rope_parameters`` per layer type); the Hub's Gemma 3 files are older
(``sliding_window_pattern``, ``rope_theta``, ``rope_local_base_freq``,
``rope_scaling``) and leave out what Gemma3TextConfig defaults. Both must
give the same model, and the Hub's format of the tiny ``gemma3`` fixture
must import and give Hugging Face's log-probabilities.
"""

import json
import os
import shutil

import numpy as np
import pytest

import memjax
from memjax import errors
from memjax.pretrained import gemma
from tests.pretrained import helpers

FIXTURES = helpers.FIXTURES
# The tiny gemma3 fixture's language model as the Hub writes a 4B+
# config.json (google/gemma-3-4b-it's keys; the defaults left out: rope
# theta 1,000,000 and the local base 10,000).
HUB_GEMMA3 = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "bos_token_id": 1,
    "eos_token_id": [2],
    "image_token_index": 262144,
    "mm_tokens_per_image": 4,
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 16,
        "hidden_size": 32,
        "intermediate_size": 48,
        "max_position_embeddings": 512,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "query_pre_attn_scalar": 24,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 4,
        "sliding_window_pattern": 2,
        "vocab_size": 64,
    },
    "torch_dtype": "float32",
    "vision_config": {
        "hidden_size": 16,
        "image_size": 28,
        "intermediate_size": 32,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
# gemma3_text as the Hub writes a 1B's config.json (google/gemma-3-1b-it's
# keys, no rope scaling).
HUB_GEMMA3_TEXT = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attn_logit_softcapping": None,
    "bos_token_id": 1,
    "eos_token_id": [2],
    "final_logit_softcapping": None,
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 32,
    "intermediate_size": 48,
    "max_position_embeddings": 512,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 24,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1000000,
    "sliding_window": 4,
    "sliding_window_pattern": 2,
    "vocab_size": 64,
}


def _fixture_config(name):
  with open(os.path.join(FIXTURES, name, "config.json")) as f:
    return json.load(f)


@pytest.mark.parametrize(
    "hub, name",
    [(HUB_GEMMA3, "gemma3"), (HUB_GEMMA3_TEXT, "gemma3_text")],
)
def test_the_hubs_format_gives_transformers_5s_settings(hub, name):
  new = _fixture_config(name)
  want = gemma.gemma3_settings(gemma.text(new))
  assert gemma.gemma3_settings(gemma.text(hub)) == want
  # Layer 1 (local) has the window and its own base; layer 2 (global) the
  # linear scaling.
  family, attention = want["family_options"], want["attention_options"]
  assert family["local_layers"] == [1] and family["post_norms"] is True
  assert family["local_attention_options"] == {
      "rope_theta": 10000.0,
      "rope_scaling_factor": 0.0,
      "sliding_window": 4,
  }
  assert attention["rope_scaling_type"] == "linear"
  assert attention["rope_scaling_factor"] == 8.0
  assert attention["query_pre_attn_scalar"] == 24.0
  assert want["scale_embedding"] is True and want["head_dim"] == 16


def test_the_hubs_defaults_and_pattern():
  text = gemma.text({"model_type": "gemma3", "text_config": {}})
  assert text["num_attention_heads"] == 8 and text["head_dim"] == 256
  assert text["bos_token_id"] == 2 and text["tie_word_embeddings"] is True
  # Every 6th layer global (Gemma3TextConfig's rule): the 6th of 7.
  local, full = "sliding_attention", "full_attention"
  types = gemma.layer_types(dict(text, num_hidden_layers=7))
  assert types == [local] * 5 + [full, local]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(final_logit_softcapping=30.0), "sets final_logit_softcapping"),
        (dict(attn_logit_softcapping=50.0), "sets attn_logit_softcapping"),
        (dict(use_bidirectional_attention=True), "use_bidirectional"),
        (dict(layer_types=["full_attention"]), "layer_types must give each"),
        (dict(rope_scaling={"rope_type": "dynamic", "factor": 8}), "'dynamic'"),
    ],
)
def test_what_memjax_lacks_is_one_line(change, message):
  with pytest.raises(errors.DataError, match=message):
    gemma.gemma3_settings(gemma.text(dict(HUB_GEMMA3_TEXT, **change)))
  with pytest.raises(errors.DataError, match="has no text_config"):
    gemma.text({"model_type": "gemma3"})


def test_the_hubs_gemma3_config_imports_and_matches_hugging_face(tmp_path):
  folder = tmp_path / "hf"
  shutil.copytree(os.path.join(FIXTURES, "gemma3"), folder)
  with open(folder / "config.json", "w") as f:
    json.dump(HUB_GEMMA3, f)
  from configs import pretrained  # pylint: disable=g-import-not-at-top

  config = pretrained.get_config("import")
  config.pretrained.path = str(folder)
  memjax.run_mode("import", config, str(tmp_path / "w"))
  expected = np.load(folder / "expected.npz")
  r = memjax.load(str(tmp_path / "w")).restored
  got = helpers.log_probs(r, expected["input_ids"])
  want = helpers.hf_log_probs(expected)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
