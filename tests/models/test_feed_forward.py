"""The feed-forward's activation (``model.activation``): ReLU or BERT's GELU."""

import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import pkm_bert
from configs import trime_wt103
from memjax import errors
from memjax import experiment
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


def test_encoder_configs_use_gelu_and_old_signatures_still_match():
  config = pkm_bert.get_config("resm_smoke")
  assert config.model.activation == "gelu"
  sig = experiment.model_signature(config, 100)["model"]
  assert sig["activation"] == "gelu"
  # A config saved before the key existed (ReLU) keeps its signature.
  config.model.activation = "relu"
  relu = experiment.model_signature(config, 100)
  del config.model["activation"]
  assert experiment.model_signature(config, 100) == relu
  lm = trime_wt103.get_config("smoke")
  assert lm.model.activation == "relu"
  assert "activation" not in experiment.model_signature(lm, 100)["model"]


def test_unknown_activation_is_a_config_error():
  config = trime_wt103.get_config("smoke")
  config.model.activation = "swish"
  model = experiment.build_model(config.model, 24)
  tokens = np.zeros((1, 4), np.int32)
  with pytest.raises(errors.ConfigError, match="model.activation"):
    model.init(jax.random.PRNGKey(0), tokens, tokens, deterministic=True)
