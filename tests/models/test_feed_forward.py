"""The feed-forward's activation (``model.activation``): ReLU or BERT's GELU."""

import json
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import pkm_bert
from configs import trime_wt103
from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax.checkpoints import checkpointing
from memjax.checkpoints import convert
from memjax.methods.pkm import layer as pkm
from memjax.models import feed_forward


def _numpy_ffn(x, p, act):
  h = x @ p["wi"]["kernel"] + p["wi"]["bias"]
  h = act(h)
  return h @ p["wo"]["kernel"] + p["wo"]["bias"]


def _gelu(h):
  """BERT's GELU, 0.5 h (1 + erf(h / sqrt 2)), written out per element."""
  erf = np.vectorize(math.erf)
  return 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))


@pytest.mark.parametrize(
    "name, act", [("relu", lambda h: np.maximum(h, 0.0)), ("gelu", _gelu)]
)
def test_feed_forward_matches_numpy(name, act):
  ffn = feed_forward.FeedForward(d_model=6, d_ff=10, activation=name)
  x = np.random.default_rng(0).normal(size=(2, 3, 6)).astype(np.float32)
  params = nn.meta.unbox(
      ffn.init(jax.random.PRNGKey(0), x, deterministic=True)["params"]
  )
  got = ffn.apply({"params": params}, x, deterministic=True)
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  want = _numpy_ffn(x.astype(np.float64), p, act)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_residual_memory_ffn_takes_the_activation():
  x = np.random.default_rng(1).normal(size=(1, 4, 8)).astype(np.float32)
  out = {}
  for name in ("relu", "gelu"):
    layer = pkm.ResMFeedForward(
        d_model=8, d_ff=16, num_keys=4, heads=1, topk=2, k_dim=4,
        activation=name,
    )  # fmt: skip
    params = layer.init(jax.random.PRNGKey(0), x, deterministic=True)
    out[name] = layer.apply(params, x, deterministic=True)
  assert not np.allclose(out["relu"], out["gelu"])


def _signature(config, vocab_size=100):
  """The signature a checkpoint of ``config``'s model must match."""
  return build.build(config, "unused").signature(vocab_size)


def test_encoder_configs_use_gelu_and_old_signatures_still_match():
  config = pkm_bert.get_config("resm_smoke")
  assert config.model.activation == "gelu"
  sig = _signature(config)["model"]
  assert sig["activation"] == "gelu"
  # A config saved before the key existed (ReLU) keeps its signature.
  config.model.activation = "relu"
  relu = _signature(config)
  saved = json.loads(config_lib.to_json(config))
  del saved["model"]["activation"]
  assert _signature(config_lib.from_json(json.dumps(saved))) == relu
  lm = trime_wt103.get_config("smoke")
  assert lm.model.activation == "relu"
  # A version-2 signature, written before the key existed (without it, as
  # every key added later while it held its first value), still matches.
  now = _signature(lm)
  old = {
      "name": now["name"],
      "signature_version": 2,
      "model": {
          k: v
          for k, v in now["model"].items()
          if not (
              k in convert.LATER_MODEL_KEYS and v == convert.LATER_MODEL_KEYS[k]
          )
      },
  }
  assert "activation" not in old["model"]
  assert convert.upgrade(old) == now
  checkpointing.check_signature(old, now, "old")
  lm.model.activation = "gelu"  # ... and a model of another activation not.
  with pytest.raises(errors.CheckpointMismatchError, match="activation"):
    checkpointing.check_signature(old, _signature(lm), "old")


def test_unknown_activation_is_a_config_error():
  config = trime_wt103.get_config("smoke")
  config.model.activation = "swish"
  model = build.build(config, "unused").model(24)
  tokens = np.zeros((1, 4), np.int32)
  with pytest.raises(errors.ConfigError, match="model.activation"):
    model.init(jax.random.PRNGKey(0), tokens, tokens, deterministic=True)
