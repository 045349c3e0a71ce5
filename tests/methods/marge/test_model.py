"""The modified-MARGE family: the biased cross-attention against NumPy, no
future leak through the bias, the bias's gradient reaching the embedder,
empty sources, and equality with the plain LM without retrieval."""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.methods.marge import model as marge
from memjax.models import transformer
from tests.models import helpers

V, N, K = 40, 4, 3
DIMS = dict(num_layers=2, d_model=16, num_heads=2, head_dim=8, d_ff=32)


def _params(module, *args, seed=0, **kwargs):
  shapes = flax.core.meta.unbox(
      jax.eval_shape(lambda: module.init(jax.random.key(0), *args, **kwargs))
  )
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda s: jnp.asarray(0.4 * rng.normal(size=s.shape), s.dtype),
      shapes["params"],
  )


@pytest.fixture(scope="module")
def setup():
  model = marge.MargeLM(
      cfg=helpers.config(V, **DIMS), segment_len=N, num_sources=K
  )
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.integers(0, V, (2, 2 * N)), jnp.int32)
  src = jnp.asarray(rng.integers(0, V, (2, K, 2 * N)), jnp.int32)
  mask = np.ones((2, K, 2 * N), bool)
  mask[0, 2] = False  # an empty slot
  mask[1, 1, N:] = False  # a source without continuation
  params = _params(model, x, x)
  params["beta"] = jnp.float32(0.7)
  return model, params, x, src, jnp.asarray(mask)


@functools.partial(jax.jit, static_argnums=0)
def _run(model, params, x, src, mask):
  return model.apply({"params": params}, x, x, sources=src, source_mask=mask)


@functools.partial(jax.jit, static_argnums=0)
def _off(model, params, x):
  return model.apply({"params": params}, x, x).target_logprob


@functools.partial(jax.jit, static_argnums=0)
def _bias(model, params, x, src):
  def f(m):
    h = m._lower(x, True)
    e_q = marge.pool_segment(m.embed_norm(h), m.segment_len, m.pooling)
    _, e_s = m.encode_sources(src)
    return m.similarity_bias(e_q, e_s)

  return model.apply({"params": params}, method=f)


@pytest.mark.newest
def test_cross_attention_matches_numpy():
  b, t, k, s, d, h, dh = 2, 3, 3, 4, 8, 2, 4
  mod = marge.BiasedCrossAttention(d_model=d, num_heads=h, head_dim=dh)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(b, t, d)).astype(np.float32)
  src = rng.normal(size=(b, k, s, d)).astype(np.float32)
  mask = rng.random((b, k, s)) > 0.3
  mask[1] = False  # lane 1: no source token at all
  bias = rng.normal(size=(b, k)).astype(np.float32)
  inputs = dict(deterministic=True, sources=src, source_mask=mask, bias=bias)
  p = _params(mod, x, None, **inputs)
  y, state = mod.apply({"params": p}, x, None, **inputs)
  assert state is None
  y = np.asarray(y)
  wq, wk, wv, wo = (
      np.asarray(p[n], np.float64) for n in ("query", "key", "value", "out")
  )
  for i in range(b):
    flat = src[i].reshape(k * s, d)
    q = np.einsum("td,dhe->the", x[i], wq)
    kk = np.einsum("sd,dhe->she", flat, wk)
    vv = np.einsum("sd,dhe->she", flat, wv)
    sc = np.einsum("the,she->hts", q, kk) / np.sqrt(dh)
    sc = sc + np.repeat(bias[i], s)[None, None]
    m = mask[i].reshape(-1)
    if not m.any():
      np.testing.assert_allclose(y[i], 0.0, atol=1e-6)
      continue
    sc = np.where(m, sc, -np.inf)
    pr = np.exp(sc - sc.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)  # one softmax over all sources' tokens
    ref = np.einsum("hed,the->td", wo, np.einsum("hts,she->the", pr, vv))
    np.testing.assert_allclose(y[i], ref, rtol=2e-4, atol=2e-5)


def _numpy_embedding(model, params, tokens):
  """e(.) of the first N positions of [M, T] ids in NumPy: the plain LM's
  first-layer output (the embedder is the lower half, here one layer), the
  LayerNorm ``embed_norm``, the mean over N positions, unit length."""
  _, state = model.apply(
      {"params": params},
      tokens,
      tokens,
      capture_intermediates=True,
      mutable=["intermediates"],
  )
  h = np.asarray(
      state["intermediates"]["layer_0"]["__call__"][0][0], np.float64
  )
  mu = h.mean(-1, keepdims=True)
  var = ((h - mu) ** 2).mean(-1, keepdims=True)
  norm = params["embed_norm"]
  h = (h - mu) / np.sqrt(var + model.cfg.norm_epsilon) * np.asarray(
      norm["scale"], np.float64
  ) + np.asarray(norm["bias"], np.float64)
  v = h[:, :N].mean(1)
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def test_bias_is_beta_times_cosine_of_query_segment(setup):
  model, params, x, src, _ = setup
  assert (
      model.cfg.num_layers == 2 and model.pooling == "mean"
  )  # The reference's.
  bias = np.asarray(_bias(model, params, x, src))
  e_q = _numpy_embedding(model, params, np.asarray(x))
  e_s = _numpy_embedding(model, params, np.asarray(src).reshape(2 * K, -1))
  ref = 0.7 * np.einsum("bd,bkd->bk", e_q, e_s.reshape(2, K, -1))
  np.testing.assert_allclose(bias, ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_no_future_leak(setup, pooling):
  model, params, x, src, mask = setup
  model = model.clone(pooling=pooling)
  x2 = x.at[:, N:].set((x[:, N:] + 7) % V)  # S_{t+1} changed
  np.testing.assert_array_equal(
      np.asarray(_bias(model, params, x, src)),
      np.asarray(_bias(model, params, x2, src)),
  )
  x3 = x.at[:, -1].set((x[:, -1] + 5) % V)  # the window's last token
  a = _run(model, params, x, src, mask).target_logprob
  b = _run(model, params, x3, src, mask).target_logprob
  np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=1e-5, atol=1e-6)
  x4 = x.at[:, N - 1].set((x[:, N - 1] + 3) % V)  # S_t changed: bias moves
  assert not np.allclose(
      _bias(model, params, x, src), _bias(model, params, x4, src)
  )


def test_bias_gradient_reaches_embedder(setup):
  model, params, x, src, _ = setup
  w = jnp.asarray(np.random.default_rng(3).normal(size=(2, K)), jnp.float32)

  def loss(p, m):  # a loss through the bias alone
    return jnp.sum(_bias.__wrapped__(m, p, x, src) * w)

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_on = grad(params, model)
  g_off = grad(params, model.clone(embed_gradient=False))
  assert abs(float(g_on["beta"])) > 0
  np.testing.assert_allclose(g_on["beta"], g_off["beta"], rtol=1e-4)
  for name in ("layer_0", "embed_norm", "embedder"):
    on = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g_on[name]))
    off = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g_off[name]))
    assert on > 1e-6 and off == 0.0, (name, on, off)


def test_padding_and_retrieval_off_equal_plain_lm(setup):
  model, params, x, src, mask = setup
  junk = jnp.where(mask, src, (src + 11) % V)  # masked tokens changed
  np.testing.assert_allclose(
      _run(model, params, x, src, mask).target_logprob,
      _run(model, params, x, junk, mask).target_logprob,
      rtol=1e-5,
      atol=1e-6,
  )
  empty = _run(model, params, x, src, jnp.zeros_like(mask)).target_logprob
  off = _off(model, params, x)
  np.testing.assert_allclose(empty, off, rtol=1e-5, atol=1e-6)
  # beta = 0 and no sources: the plain LM with the shared parameters.
  plain = transformer.TransformerLM(cfg=helpers.config(V, **DIMS))
  shared = {k: v for k, v in params.items() if k in ("embedder", "final_norm")}
  for i in range(2):
    layer = dict(params[f"layer_{i}"])
    layer.pop("cross_attention", None)
    layer.pop("ln_cross", None)
    shared[f"layer_{i}"] = layer
  ref = _off(plain, shared, x)
  zero = dict(params, beta=jnp.float32(0.0))
  got = _off(model, zero, x)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_sharded_equals_unsharded(tmp_path):
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax import config as config_lib  # pylint: disable=g-import-not-at-top
  from memjax import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from memjax.run import step as step_lib  # pylint: disable=g-import-not-at-top

  c = config_lib.base_config()
  m = c.model
  m.family, m.cutoffs, m.max_len, m.dropout = "marge", (), 64, 0.0
  m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 2, 16, 2, 8, 32
  m.family_options.segment_len, m.family_options.num_sources = N, K
  mesh = {"data": 2, "fsdp": 2, "tensor": 2}
  run = build.build(c, str(tmp_path), mesh=mesh)
  model = run.model(V)
  assert run.extra_inputs == ("sources", "source_mask")
  rng = np.random.default_rng(4)
  b = dict(
      inputs=rng.integers(0, V, (8, 2 * N)).astype(np.int32),
      targets=rng.integers(0, V, (8, 2 * N)).astype(np.int32),
      sources=rng.integers(0, V, (8, K, 2 * N)).astype(np.int32),
      source_mask=rng.random((8, K, 2 * N)) > 0.3,
  )
  assert jax.device_count() == 8
  mesh = run.mesh
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2, "memory": 1}
  state, _ = step_lib.create_state(
      model, None, mesh, b, jax.random.key(3), run.state_collections()
  )

  def f(p, batch):
    return model.apply(
        {"params": p},
        batch["inputs"],
        batch["targets"],
        **{k: batch[k] for k in run.extra_inputs},
    ).target_logprob

  sharded = sharding_lib.jit(f, mesh)(
      state.params, sharding_lib.put_global_batch(b, mesh)
  )
  host = jax.device_get(state.params)
  single = jax.jit(f)(host, {k: jnp.asarray(v) for k, v in b.items()})
  np.testing.assert_allclose(np.asarray(sharded), single, atol=1e-5)
