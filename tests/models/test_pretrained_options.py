"""The pretrained families' options on the existing parts, against NumPy:
grouped-query attention with q/k/v and output biases, rotary positions
(with Llama 3's scaling), RMSNorm, the gated feed-forward, learned
positions and an untied softmax."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax import build
from memjax import errors
from memjax import settings as settings_lib
from memjax.models import attention
from memjax.models import feed_forward
from memjax.models import blocks
from memjax.models import transformer

B, T, D, H, KV, DH = 2, 6, 16, 4, 2, 8


def normal(seed, shape, scale=1.0):
  return (np.random.default_rng(seed).normal(size=shape) * scale).astype(
      np.float32
  )


def random_like(params, seed):
  leaves, tree = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(seed)
  new = [rng.normal(size=l.shape).astype(np.float32) * 0.5 for l in leaves]
  return jax.tree_util.tree_unflatten(tree, new)


def llama3_inv_freq(dh, theta, factor, low, high, old_len):
  """Hugging Face's _compute_llama3_parameters, one frequency at a time."""
  out = []
  for i in range(0, dh, 2):
    f = 1.0 / theta ** (i / dh)
    wavelen = 2 * math.pi / f
    if factor and wavelen > old_len / low:
      f = f / factor
    elif factor and wavelen >= old_len / high:
      s = (old_len / wavelen - low) / (high - low)
      f = (1 - s) * f / factor + s * f
    out.append(f)
  return np.array(out)


def numpy_gqa(
    p,
    x,
    inv_freq,
    qkv_bias,
    out_bias,
    window=0,
    qk_eps=None,
    plus_one=False,
    scalar=DH,
):
  """Causal GQA in float64: query head h reads kv head h // (H / kv); the
  rotary pairs are features (i, i + dh/2) of a head, turned by t inv[i];
  with a window query t reads keys t - window + 1 .. t only; with
  ``qk_eps`` each head's q and k are RMS-normalised before rotation, by
  scale or (``plus_one``) 1 + scale; scores are divided by sqrt(scalar)."""
  x = x.astype(np.float64)
  p = {
      k: np.asarray(v["scale"] if isinstance(v, dict) else v, np.float64)
      for k, v in p.items()
  }

  def rms(a, scale):
    if qk_eps is None:
      return a
    scale = 1 + scale if plus_one else scale
    return a / np.sqrt((a * a).mean(-1, keepdims=True) + qk_eps) * scale

  half, kv = DH // 2, p["key"].shape[1]
  y = np.zeros((B, T, D))
  for b in range(B):
    for h in range(H):
      g = h // (H // kv)
      q = x[b] @ p["query"][:, h] + (p["query_bias"][h] if qkv_bias else 0)
      k = x[b] @ p["key"][:, g] + (p["key_bias"][g] if qkv_bias else 0)
      v = x[b] @ p["value"][:, g] + (p["value_bias"][g] if qkv_bias else 0)
      q, k = rms(q, p.get("query_norm")), rms(k, p.get("key_norm"))
      if inv_freq is not None:
        for a in (q, k):
          for t in range(T):
            for i in range(half):
              c, s = math.cos(t * inv_freq[i]), math.sin(t * inv_freq[i])
              u, w = a[t, i], a[t, i + half]
              a[t, i], a[t, i + half] = u * c - w * s, w * c + u * s
      for t in range(T):
        lo = max(0, t - window + 1) if window else 0
        sc = q[t] @ k[lo : t + 1].T / math.sqrt(scalar)
        pr = np.exp(sc - sc.max())
        pr /= pr.sum()
        y[b, t] += (pr @ v[lo : t + 1]) @ p["out"][h]
  return y + (p["out_bias"] if out_bias else 0)


@pytest.mark.parametrize(
    "options",
    [
        dict(num_kv_heads=KV, qkv_bias=True, rope_theta=500000.0),
        dict(
            num_kv_heads=KV,
            rope_theta=500000.0,
            rope_scaling_factor=8.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_original_max_len=256,
        ),
        dict(num_kv_heads=H, qkv_bias=True, out_bias=True),
        dict(num_kv_heads=KV, rope_theta=10000.0, sliding_window=2),
        dict(
            num_kv_heads=KV,
            rope_theta=10000.0,
            rope_scaling_factor=4.0,
            rope_scaling_type="linear",
        ),
        dict(
            num_kv_heads=KV,
            qkv_bias=True,
            rope_theta=10000.0,
            qk_norm="rms",
            qk_norm_epsilon=1e-5,
        ),
        dict(  # Gemma 3's.
            num_kv_heads=KV,
            rope_theta=10000.0,
            qk_norm="rms_plus_one",
            qk_norm_epsilon=1e-6,
            query_pre_attn_scalar=24.0,
            sliding_window=3,
        ),
    ],
)
def test_attention_options_match_numpy(options):
  layer = attention.CausalSelfAttention(
      d_model=D,
      num_heads=H,
      head_dim=DH,
      options=attention.VanillaOptions(**options),
  )
  x = normal(0, (B, T, D))
  params = random_like(layer.init(jax.random.PRNGKey(0), x), 1)
  y, _ = layer.apply(params, jnp.asarray(x))
  p = jax.tree_util.tree_map(np.asarray, flax_unbox(params)["params"])
  assert p["key"].shape == (D, options["num_kv_heads"], DH)
  inv = None
  if options.get("rope_scaling_type") == "linear":  # Positions / factor.
    inv = llama3_inv_freq(DH, options["rope_theta"], 0, 1, 4, 1) / 4.0
  elif options.get("rope_theta"):
    inv = llama3_inv_freq(
        DH,
        options["rope_theta"],
        options.get("rope_scaling_factor", 0),
        options.get("rope_low_freq_factor", 1),
        options.get("rope_high_freq_factor", 4),
        options.get("rope_original_max_len", 1),
    )
  want = numpy_gqa(
      p,
      x,
      inv,
      options.get("qkv_bias", False),
      options.get("out_bias", False),
      window=options.get("sliding_window", 0),
      qk_eps=options.get("qk_norm_epsilon") if "qk_norm" in options else None,
      plus_one=options.get("qk_norm") == "rms_plus_one",
      scalar=options.get("query_pre_attn_scalar", DH),
  )
  np.testing.assert_allclose(np.asarray(y), want, atol=2e-5, rtol=2e-5)


def flax_unbox(params):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  return nn.meta.unbox(params)


def test_llama3_scaling_changes_the_long_wavelengths_only():
  from memjax.models import rotary  # pylint: disable=g-import-not-at-top

  plain = rotary.inverse_frequencies(DH, 500000.0)
  scaled = rotary.inverse_frequencies(DH, 500000.0, 8.0, 1.0, 4.0, 256)
  want = llama3_inv_freq(DH, 500000.0, 8.0, 1.0, 4.0, 256)
  np.testing.assert_allclose(scaled, want, rtol=1e-12)
  assert scaled[0] == plain[0] and scaled[-1] == plain[-1] / 8.0
  assert plain[1] / 8.0 < scaled[1] < plain[1]  # Interpolated.


def test_yarn_speeds_and_tables():
  from memjax.models import rotary  # pylint: disable=g-import-not-at-top

  # d_h 8, base 10,000, factor 4, an original 2,048 positions: the pair
  # turning beta_fast (32) times over them is 1.008, the one turning
  # beta_slow (1) time 2.51, so the ramp runs from pair 1 to pair 3: pairs
  # 0 and 1 kept, pair 2 half way (0.01 -> 0.00625), pair 3 slowed 4 times
  # (as Hugging Face's _compute_yarn_parameters gives them).
  got = rotary.inverse_frequencies(
      8, 1e4, 4.0, original_max_len=2048, scaling_type="yarn"
  )
  np.testing.assert_allclose(got, [1.0, 0.1, 0.00625, 0.00025], rtol=1e-12)
  cos, sin = rotary.tables(3, got, 1.5)
  assert cos[0, 0] == 1.5 and sin[0, 0] == 0.0
  np.testing.assert_allclose(sin[2, 1], 1.5 * math.sin(0.2), rtol=1e-6)


def test_kv_heads_must_divide_the_heads():
  layer = attention.CausalSelfAttention(
      d_model=D,
      num_heads=H,
      head_dim=DH,
      options=attention.VanillaOptions(num_kv_heads=3),
  )
  with pytest.raises(errors.ConfigError, match="num_kv_heads 3 must divide"):
    layer.init(jax.random.PRNGKey(0), jnp.zeros((1, 2, D)))


def test_rms_norm_matches_numpy():
  x = normal(2, (B, T, D))
  norm = blocks.make_norm("rms", "n", jnp.float32, 1e-5)
  params = random_like(norm.init(jax.random.PRNGKey(0), x), 3)
  y = norm.apply(params, jnp.asarray(x))
  scale = np.asarray(flax_unbox(params)["params"]["scale"], np.float64)
  x64 = x.astype(np.float64)
  want = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5) * scale
  np.testing.assert_allclose(np.asarray(y), want, atol=1e-5, rtol=1e-5)
  with pytest.raises(errors.ConfigError, match="norm must be one of"):
    blocks.make_norm("batch", "n", jnp.float32)


def test_rms_plus_one_norm_is_gemmas():
  x = normal(2, (B, T, D))
  norm = blocks.make_norm("rms_plus_one", "n", jnp.float32, 1e-6, axis="kv")
  params = norm.init(jax.random.PRNGKey(0), x)
  # It starts as a plain RMSNorm: its scale is 0, the factor 1 + 0.
  assert not np.any(np.asarray(flax_unbox(params)["params"]["scale"]))
  params = random_like(params, 3)
  y = norm.apply(params, jnp.asarray(x))
  scale = np.asarray(flax_unbox(params)["params"]["scale"], np.float64)
  x64 = x.astype(np.float64)
  want = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * (1 + scale)
  np.testing.assert_allclose(np.asarray(y), want, atol=1e-5, rtol=1e-5)


def test_gated_feed_forward_is_swiglu_without_biases():
  ffn = feed_forward.GatedFeedForward(d_model=D, d_ff=24, activation="silu")
  x = normal(4, (B, T, D))
  params = random_like(
      ffn.init(jax.random.PRNGKey(0), x, deterministic=True), 5
  )
  y = ffn.apply(params, jnp.asarray(x), deterministic=True)
  p = flax_unbox(params)["params"]
  assert sorted(p) == ["down", "gate", "up"]
  assert all(sorted(p[k]) == ["kernel"] for k in p)
  w = {k: np.asarray(p[k]["kernel"], np.float64) for k in p}
  x64 = x.astype(np.float64)
  a = x64 @ w["gate"]
  want = ((a / (1 + np.exp(-a))) * (x64 @ w["up"])) @ w["down"]
  np.testing.assert_allclose(np.asarray(y), want, atol=1e-5, rtol=1e-5)


def model_settings(**changes):
  fields = dict(
      num_layers=1,
      d_model=D,
      num_heads=H,
      head_dim=DH,
      d_ff=32,
      cutoffs=(),
      scale_embedding=False,
      dropout=0.0,
      max_len=16,
  )
  fields.update(changes)
  return settings_lib.Model(**fields)


def test_learned_positions_and_untied_softmax():
  model = transformer.decoder_lm(
      model_settings(
          feed_forward="glu",
          activation="silu",
          attention_options={"rope_theta": 10000.0},
          family_options=dict(
              positions="learned", norm="rms", tie_embeddings=False
          ),
      ),
      vocab_size=11,
      parts=build.parts(),
  )
  ids = np.array([[1, 4, 9, 2, 0]], np.int32)
  params = random_like(model.init(jax.random.PRNGKey(0), ids), 6)
  p = flax_unbox(params)["params"]
  assert p["pos_embed"].shape == (16, D)
  assert "bias" not in p["layer_0"]["ln_attn"]
  x = model.apply(params, ids, False, method=model.embed)
  table = np.asarray(p["embedder"]["embed_0"])
  want = table[ids[0]] + np.asarray(p["pos_embed"])[:5]
  np.testing.assert_allclose(np.asarray(x)[0], want, rtol=1e-6)
  h = normal(7, (3, D))
  lp = model.apply(params, jnp.asarray(h), method=model.log_probs)
  logits = h.astype(np.float64) @ np.asarray(p["embedder"]["output"]).T
  want = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(np.asarray(lp), want, atol=1e-5)


def gemma_like(local_layers, **changes):
  return transformer.decoder_lm(
      model_settings(
          num_layers=3,
          feed_forward="glu",
          activation="gelu_tanh",
          attention_options={"rope_theta": 10000.0, "num_kv_heads": KV},
          family_options=dict(
              positions="none",
              norm="rms_plus_one",
              post_norms=True,
              local_layers=local_layers,
              local_attention_options={"sliding_window": 2, "rope_theta": 1e2},
          ),
          **changes,
      ),
      vocab_size=11,
      parts=build.parts(),
  )


def test_post_norms_and_local_layers():
  # 1-based layers, -1 the last: layers 0 and 2 (0-based) are local.
  model = gemma_like([1, -1])
  assert model.attention_options_at(0) == {
      "rope_theta": 1e2,
      "num_kv_heads": KV,
      "sliding_window": 2,
  }
  assert model.attention_options_at(1) == {
      "rope_theta": 10000.0,
      "num_kv_heads": KV,
  }
  ids = np.array([[1, 4, 9, 2, 0, 3]], np.int32)
  params = model.init(jax.random.PRNGKey(0), ids)
  p = flax_unbox(params)["params"]
  assert sorted(p["layer_0"]) == [
      "attention",
      "ffn",
      "ln_attn",
      "ln_attn_post",
      "ln_ffn",
      "ln_ffn_post",
  ]
  # The local options change what layers 0 and 2 compute: the same
  # parameters with every layer global give the same first position (no
  # rotation, no key outside the window) and others after it.
  params = random_like(params, 4)
  h = model.apply(params, ids, method=model.hidden_states)[0]
  h_global = gemma_like([]).apply(params, ids, method=model.hidden_states)[0]
  np.testing.assert_allclose(h[:, :1], h_global[:, :1], rtol=1e-5, atol=1e-6)
  assert not np.allclose(h[:, 1:], h_global[:, 1:], atol=1e-3)
  # Scanned, only consecutive layers alike share a run.
  names = lambda m: [r.name for r in m.layer_runs()]
  assert names(gemma_like([1, 3], scan_layers=True)) == [
      "layer_0",
      "layer_1",
      "layer_2",
  ]
  assert names(gemma_like([2, 3], scan_layers=True)) == [
      "layer_0",
      "layer_1_to_2",
  ]
  with pytest.raises(errors.ConfigError, match=r"local_layers \[4, 0\]"):
    gemma_like([4, 0]).init(jax.random.PRNGKey(0), ids)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(family_options=dict(positions="alibi")), "positions must be"),
        (dict(family_options=dict(norm="batch")), "norm must be one of"),
        (dict(family_options=dict(rope=1)), "does not take"),
        (dict(attention_options=dict(qk_norm="l2")), "qk_norm must be"),
        (dict(attention_options=dict(sliding_window=-1)), "sliding_window"),
        (
            dict(
                attention_options=dict(
                    rope_theta=1e4,
                    rope_scaling_factor=2.0,
                    rope_scaling_type="ntk",
                )
            ),
            "rope_scaling_type must be one of llama3, linear, yarn",
        ),
        (
            dict(cutoffs=(4,), family_options=dict(tie_embeddings=False)),
            "set model.cutoffs to",
        ),
    ],
)
def test_bad_options_are_one_line(changes, message):
  with pytest.raises(errors.ConfigError, match=message):
    model = transformer.decoder_lm(
        model_settings(**changes), vocab_size=11, parts=build.parts()
    )
    model.init(jax.random.PRNGKey(0), np.zeros((1, 3), np.int32))
