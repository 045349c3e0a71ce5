"""The feed-forward's activation (``model.activation``): ReLU or one of the
two GELUs (exact, tanh), also the BERT-style MLM head's."""

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
from memjax import settings as settings_lib
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


def _gelu_tanh(h):
  """Google's BERT / GPT-2 GELU, 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715
  h^3)))."""
  return (
      0.5
      * h
      * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
  )


_ACTS = [
    ("relu", lambda h: np.maximum(h, 0.0)),
    ("gelu", _gelu),
    ("gelu_tanh", _gelu_tanh),
]


def test_the_two_gelus_differ():
  h = np.linspace(-4.0, 4.0, 81)
  gap = np.abs(_gelu(h) - _gelu_tanh(h)).max()
  assert 1e-4 < gap < 1e-3  # about 2e-4 near |h| = 2


@pytest.mark.parametrize("name, act", _ACTS)
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


def _numpy_mlm_head(hidden, p, act, eps):
  """dense, activation, LayerNorm, tied embedding plus bias, in float64."""
  h = act(hidden @ p["mlm_dense"]["kernel"] + p["mlm_dense"]["bias"])
  mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
  h = (h - mean) / np.sqrt(var + eps) * p["mlm_norm"]["scale"]
  h = h + p["mlm_norm"]["bias"]
  return h @ p["embedding"].T + p["mlm_bias"]


@pytest.mark.parametrize("name, act", _ACTS)
def test_mlm_head_takes_the_models_activation(name, act):
  config = pkm_bert.get_config("smoke")
  config.model.activation = name
  model = build.build(config, "unused").model(40)
  tokens = np.arange(1, 9, dtype=np.int32)[None]
  variables = model.init(
      jax.random.PRNGKey(0), tokens, tokens, deterministic=True
  )
  params = nn.meta.unbox(variables["params"])
  # A non-zero head bias and norm, so every parameter counts.
  rng = np.random.default_rng(2)
  for name_ in ("mlm_bias", "mlm_norm", "mlm_dense"):
    params[name_] = jax.tree_util.tree_map(
        lambda a: a + rng.normal(size=a.shape).astype(a.dtype), params[name_]
    )
  hidden = rng.normal(size=(2, 3, config.model.d_model)).astype(np.float32)
  got = model.apply({"params": params}, hidden, method=model.mlm_logits)
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  want = _numpy_mlm_head(
      hidden.astype(np.float64), p, act, config.model.norm_epsilon
  )
  # float32 against float64: about 2e-7 apart; the exact and the tanh GELU
  # give heads about 2e-5 apart here, ReLU and a GELU about 7e-3.
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
  for other_name, other in _ACTS:  # ... and not another's.
    if other_name != name:
      eps = config.model.norm_epsilon
      gap = np.abs(got - _numpy_mlm_head(hidden, p, other, eps)).max()
      assert gap > 1e-5, other_name


def test_residual_memory_ffn_takes_the_activation():
  x = np.random.default_rng(1).normal(size=(1, 4, 8)).astype(np.float32)
  out = {}
  for name in ("relu", "gelu"):
    layer = pkm.ResMFeedForward(
        d_model=8,
        d_ff=16,
        options=pkm.MemoryOptions(num_keys=4, heads=1, topk=2, k_dim=4),
        activation=name,
    )
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
  saved = json.loads(settings_lib.to_json(config))
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
