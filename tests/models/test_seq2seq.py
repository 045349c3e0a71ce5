"""The encoder-decoder family, with the plain attention and with relative
positions ('rpe'): causal decoder, padding-invariant encoder, cached
decoding equal to teacher forcing, sharded equal to unsharded, and label
smoothing against a NumPy reference."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax import sharding as sharding_lib
from memjax.data import token_batching
from memjax.run import step as step_lib

V = 40


def _config(attention: str = "vanilla"):
  c = config_lib.base_config()
  m = c.model
  m.attention = attention
  m.family, m.cutoffs, m.max_len = "encoder_decoder", (), 64
  m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 2, 32, 4, 8, 64
  m.family_options.encoder_layers = 1
  m.norm_position, m.dropout = "post", 0.0
  return c


def _model(c):
  """The model ``c`` describes, with a vocabulary of V."""
  return build.build(c, "unused").model(V)


# The plain attention over sinusoid positions, and relative positions
# (encoder both ways, decoder causal, decoding from the cached keys).
@pytest.fixture(scope="module", params=["vanilla", "rpe"])
def setup(request):
  model = _model(_config(request.param))
  rng = np.random.default_rng(0)
  pairs = [
      (
          rng.integers(3, V, n).astype(np.int32),
          rng.integers(3, V, k).astype(np.int32),
      )
      for n, k in ((5, 7), (9, 4), (3, 9), (8, 8))
  ]
  src = [np.append(s, 1) for s, _ in pairs]
  tgt = [np.append(t, 1) for _, t in pairs]
  batch = token_batching.make_pair_batch(src, tgt, 12, 10)
  init = jax.jit(lambda k: model.init(k, jnp.zeros((1, 4), jnp.int32)))
  params = nn.meta.unbox(init(jax.random.PRNGKey(0))["params"])
  apply = jax.jit(lambda p, s, i, t: model.apply({"params": p}, i, t, source=s))
  return model, params, batch, apply


def test_decoder_is_causal(setup):
  _, params, b, apply = setup
  out = apply(params, b["source"], b["inputs"], b["targets"])
  inputs = b["inputs"].copy()
  inputs[:, 5:] = (inputs[:, 5:] + 7) % V
  changed = apply(params, b["source"], inputs, b["targets"])
  np.testing.assert_allclose(
      out.target_logprob[:, :5], changed.target_logprob[:, :5], atol=1e-5
  )
  np.testing.assert_allclose(
      out.features[:, :5], changed.features[:, :5], atol=1e-5
  )
  assert not np.allclose(
      out.target_logprob[:, 5:], changed.target_logprob[:, 5:]
  )


def test_encoder_padding_never_changes_the_output(setup):
  _, params, b, apply = setup
  out = apply(params, b["source"], b["inputs"], b["targets"])
  wider = np.pad(b["source"], ((0, 0), (0, 20)))
  padded = apply(params, wider, b["inputs"], b["targets"])
  np.testing.assert_allclose(
      out.target_logprob, padded.target_logprob, atol=1e-5
  )
  np.testing.assert_allclose(out.hidden, padded.hidden, atol=1e-5)


def test_cached_decoding_equals_teacher_forcing(setup):
  model, params, b, apply = setup
  out = apply(params, b["source"], b["inputs"], b["targets"])

  @jax.jit
  def stepwise(p, src, inputs):
    enc, mask = model.apply({"params": p}, src, method=model.encode)
    cache = model.apply(
        {"params": p}, enc, inputs.shape[1], method=model.init_cache
    )

    def body(cache, xs):
      tok, t = xs
      logp, g, cache = model.apply(
          {"params": p}, tok, t, cache, mask, method=model.decode_step
      )
      return cache, (logp, g)

    _, (logp, g) = jax.lax.scan(
        body, cache, (inputs.T, jnp.arange(inputs.shape[1]))
    )
    return jnp.swapaxes(logp, 0, 1), jnp.swapaxes(g, 0, 1)

  logp, g = stepwise(params, b["source"], b["inputs"])
  got = np.take_along_axis(np.asarray(logp), b["targets"][..., None], -1)[
      ..., 0
  ]
  np.testing.assert_allclose(got, out.target_logprob, atol=1e-4)
  np.testing.assert_allclose(g, out.features, atol=1e-4)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_memory_feature_is_the_same_g_in_training_and_decoding(norm_position):
  """'final_output' (the authors' knn_embed) is the decoder's output after
  its last LayerNorm, teacher-forced and step by step alike; the default,
  the last FFN's input, is not."""
  c = _config()
  c.model.norm_position = norm_position
  b = token_batching.make_pair_batch(
      [np.array([5, 9, 7, 1]), np.array([4, 3, 1])],
      [np.array([8, 6, 1]), np.array([3, 5, 7, 6, 1])],
      6,
      6,
  )
  feats = {}
  for feature in ("last_ffn_input", "final_output"):
    c.model.family_options.memory_feature = feature
    model = _model(c)
    params = nn.meta.unbox(
        model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))[
            "params"
        ]
    )
    out = model.apply(
        {"params": params}, b["inputs"], b["targets"], source=b["source"]
    )

    @jax.jit
    def stepwise(p, src, inputs):
      enc, mask = model.apply({"params": p}, src, method=model.encode)
      cache = model.apply({"params": p}, enc, 6, method=model.init_cache)

      def body(cache, xs):
        _, g, cache = model.apply(
            {"params": p}, xs[0], xs[1], cache, mask, method=model.decode_step
        )
        return cache, g

      _, g = jax.lax.scan(body, cache, (inputs.T, jnp.arange(6)))
      return jnp.swapaxes(g, 0, 1)

    np.testing.assert_allclose(
        stepwise(params, b["source"], b["inputs"]),
        out.features,
        rtol=1e-4,
        atol=1e-4,
    )
    feats[feature] = (np.asarray(out.features), np.asarray(out.hidden))
  g, hidden = feats["final_output"]
  np.testing.assert_array_equal(g, hidden)
  np.testing.assert_array_equal(feats["last_ffn_input"][1], hidden)
  assert not np.allclose(feats["last_ffn_input"][0], hidden)
  c.model.family_options.memory_feature = "output"
  model = _model(c)
  with pytest.raises(errors.ConfigError, match="memory_feature"):
    model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))


def _stack_model(norm_position, **stacks):
  c = _config()
  c.model.norm_position = norm_position
  for key, value in stacks.items():
    c.model.family_options[key] = value
  return _model(c)


def test_each_stack_takes_its_own_norm_position():
  """The authors' TRIMEMT_ext (fairseq's --decoder-normalize-before only):
  its encoder is the all-post-LN model's, its decoder the all-pre-LN
  model's, on the same parameters."""
  authors = _stack_model("post", decoder_norm_position="pre")
  post, pre = _stack_model("post"), _stack_model("pre")
  init = lambda m: nn.meta.unbox(
      m.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
  )
  params = init(authors)
  # A final LayerNorm on the pre-LN decoder only.
  assert "decoder_norm" in params and "encoder_norm" not in params
  post_params = {k: v for k, v in params.items() if k != "decoder_norm"}
  rng = np.random.default_rng(3)
  pre_params = dict(
      params,
      encoder_norm=jax.tree.map(
          lambda a: a + rng.normal(size=a.shape).astype(a.dtype),
          params["decoder_norm"],
      ),
  )
  for m, p in ((post, post_params), (pre, pre_params)):
    want = jax.eval_shape(lambda m=m: init(m))
    assert jax.tree.map(np.shape, p) == jax.tree.map(np.shape, want)
  source = jnp.asarray([[5, 9, 7, 1, 0], [4, 3, 1, 0, 0]], jnp.int32)
  encode = lambda m, p: m.apply({"params": p}, source, method=m.encode)
  enc, mask = encode(authors, params)
  np.testing.assert_array_equal(enc, encode(post, post_params)[0])
  assert not np.allclose(enc, encode(pre, pre_params)[0], atol=1e-3)

  def steps(m, p):
    """Log-probabilities of two decoder steps over ``enc``."""
    cache = m.apply({"params": p}, enc, 2, method=m.init_cache)
    out = []
    for t, tok in enumerate((0, 6)):
      logp, _, cache = m.apply(
          {"params": p},
          jnp.full((2,), tok, jnp.int32),
          jnp.int32(t),
          cache,
          mask,
          method=m.decode_step,
      )
      out.append(np.asarray(logp))
    return np.stack(out)

  got = steps(authors, params)
  np.testing.assert_allclose(got, steps(pre, pre_params), rtol=0, atol=1e-6)
  assert not np.allclose(got, steps(post, post_params), atol=1e-3)
  # The same model, written from the other side.
  other = _stack_model("pre", encoder_norm_position="post")
  b = token_batching.make_pair_batch(
      [np.array([5, 9, 7, 1])], [np.array([8, 6, 1])], 6, 6
  )
  run = lambda m: m.apply(
      {"params": params}, b["inputs"], b["targets"], source=b["source"]
  )
  np.testing.assert_array_equal(
      run(authors).target_logprob, run(other).target_logprob
  )
  with pytest.raises(errors.ConfigError, match="decoder_norm_position"):
    _stack_model("post", decoder_norm_position="before")


def test_label_smoothing_matches_numpy(setup):
  _, params, b, apply = setup
  out = apply(params, b["source"], b["inputs"], b["targets"])
  c = _config()
  c.loss.name = "label_smoothed"
  c.loss.options = ml_collections.ConfigDict({"epsilon": 0.1})
  loss_fn = build.build(c, "unused").objective(10)
  loss, metrics = loss_fn(out, b, step=0, rng=None)
  # fairseq's label_smoothed_nll_loss on the full log-softmax, in float64.
  logits = np.asarray(
      jnp.einsum("btd,vd->btv", out.hidden, params["target_embedding"]),
      np.float64,
  )
  lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(lp, b["targets"][..., None], -1)[..., 0]
  eps_i = 0.1 / (V - 1)
  per = (1 - 0.1 - eps_i) * nll + eps_i * (-lp.sum(-1))
  w = b["weights"]
  np.testing.assert_allclose(loss, (per * w).sum() / w.sum(), rtol=1e-5)
  np.testing.assert_allclose(metrics["aux_nll_sum"], (nll * w).sum(), rtol=1e-5)


def test_sharded_equals_unsharded(setup):
  model, _, b, apply = setup
  assert jax.device_count() == 8
  run = build.build(
      _config(), "unused", mesh={"data": 2, "fsdp": 2, "tensor": 2}
  )
  mesh = run.mesh
  state, _ = step_lib.create_state(
      model, None, mesh, b, jax.random.PRNGKey(3), run.state_collections()
  )

  def f(p, batch):
    out = model.apply(
        {"params": p},
        batch["inputs"],
        batch["targets"],
        **{k: batch[k] for k in run.extra_inputs},
    )
    return out.target_logprob

  fn = sharding_lib.jit(f, mesh)
  b8 = {k: np.tile(v, (2, 1)) for k, v in b.items()}  # 8 rows over 4 shards
  sharded = fn(state.params, sharding_lib.put_global_batch(b8, mesh))
  host = jax.device_get(state.params)
  single = apply(host, b["source"], b["inputs"], b["targets"])
  np.testing.assert_allclose(
      np.asarray(sharded), np.tile(single.target_logprob, (2, 1)), atol=1e-5
  )


def test_bfloat16_output_statistics_and_their_gradient(setup):
  """A bfloat16 step's output statistics come from bfloat16 logits through
  ``adaptive.narrow_log_softmax_stats``: the loss and every parameter's
  gradient equal autodiff's of ``log_softmax`` on the same logits (up to
  rounding), and the loss is within bfloat16 rounding of float32's."""
  model, params, b, _ = setup
  narrow = model.clone(cfg=dataclasses.replace(model.cfg, dtype="bfloat16"))
  w = b["weights"]

  def loss(p, m):
    out = m.apply({"params": p}, b["inputs"], b["targets"], source=b["source"])
    assert out.target_logprob.dtype == jnp.float32
    lp = out.target_logprob + 0.1 * out.mean_logprob
    return -jnp.sum(lp * w) / w.sum()

  def autodiff_loss(p):
    """The same statistics by autodiff from the decoder's final hidden."""
    out = narrow.apply({"params": p}, b["inputs"], None, source=b["source"])
    emb = p["target_embedding"].astype(jnp.bfloat16)
    logits = jnp.einsum("btd,vd->btv", out.hidden.astype(jnp.bfloat16), emb)
    lps = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    tgt = jnp.take_along_axis(lps, b["targets"][..., None], -1)[..., 0]
    return -jnp.sum((tgt + 0.1 * lps.mean(-1)) * w) / w.sum()

  l16, g16 = jax.value_and_grad(loss)(params, narrow)
  l_ref, g_ref = jax.value_and_grad(autodiff_loss)(params)
  np.testing.assert_allclose(l16, l_ref, rtol=1e-5)
  for a, c in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g16)):
    assert np.linalg.norm(c - a) <= 1e-3 * np.linalg.norm(a) + 1e-6
  np.testing.assert_allclose(l16, loss(params, model), rtol=2e-2)
