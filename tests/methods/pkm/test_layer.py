"""Product-key memory against a NumPy reference written from the papers
(Lample et al. 2019, section 3; Kim & Jung 2020, sections 2.1, 3.2, 4.2)."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from memjax import build
from memjax import errors
from memjax.methods.pkm import layer as pkm
from memjax.models import transformer
from tests.models import helpers

C, H, K, KD, D = 6, 2, 3, 8, 12  # sub-keys, heads, k, k_dim, d_model


def _np_topk(x, k):
  """Indices of the k largest, ties to the lower index."""
  return np.argsort(-x, kind="stable")[:k]


def np_lookup(q, keys, k):
  """Reference of the product-key search: per row and head, the top k of
  each half, then the top k of the k x k candidate sums (a-major order)."""
  n, h, kd = q.shape
  c = keys.shape[2]
  scores = np.zeros((n, h, k))
  slots = np.zeros((n, h, k), np.int64)
  for i in range(n):
    for j in range(h):
      s1 = keys[j, 0] @ q[i, j, : kd // 2]
      s2 = keys[j, 1] @ q[i, j, kd // 2 :]
      i1, i2 = _np_topk(s1, k), _np_topk(s2, k)
      cand = (s1[i1][:, None] + s2[i2][None, :]).reshape(-1)
      best = _np_topk(cand, k)
      scores[i, j] = cand[best]
      slots[i, j] = i1[best // k] * c + i2[best % k]
  return scores, slots


def np_layer(x, p, k, mask=None):
  """Reference of the whole layer with LayerNorm queries: [N, D] -> [N, V]."""
  q = x @ p["query"]["kernel"] + p["query"]["bias"]
  mu, var = q.mean(-1, keepdims=True), q.var(-1, keepdims=True)
  q = (q - mu) / np.sqrt(var + 1e-5)
  q = q * p["query_norm"]["scale"] + p["query_norm"]["bias"]
  q = q.reshape(len(x), H, KD)
  scores, slots = np_lookup(q, p["keys"], k)
  w = np.exp(scores - scores.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  out = np.einsum("nhk,nhkv->nv", w, p["values"][slots])
  if mask is not None:
    out = out * mask[:, None]
  return scores, slots, w, out


def _layer(**kw):
  options = pkm.MemoryOptions(num_keys=C, heads=H, topk=K, k_dim=KD, **kw)
  return pkm.ProductKeyMemory(d_model=D, options=options)


def _unbox(tree):
  return jax.tree.map(
      np.asarray, nn.meta.unbox(tree), is_leaf=lambda x: x is None
  )


@pytest.fixture(scope="module")
def layer_and_params():
  layer = _layer()
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, D))
  variables = layer.init(jax.random.PRNGKey(0), x, deterministic=True)
  p = _unbox(variables["params"])
  p["query_norm"]["scale"] = np.linspace(0.5, 1.5, H * KD)
  p["query_norm"]["bias"] = np.linspace(-0.2, 0.2, H * KD)
  return layer, p, np.asarray(x)


@pytest.mark.newest
def test_layer_matches_numpy_reference(layer_and_params):
  layer, p, x = layer_and_params
  out, state = layer.apply(
      {"params": p}, x, deterministic=True, mutable=[pkm.USAGE_COLLECTION]
  )
  xf = x.reshape(-1, D)
  scores, slots, w, ref = np_layer(xf, p, K)
  np.testing.assert_allclose(out.reshape(-1, D), ref, rtol=2e-5, atol=2e-5)
  # Scores, indices and weights through the pure search function.
  q = xf @ p["query"]["kernel"] + p["query"]["bias"]
  q = (q - q.mean(-1, keepdims=True)) / np.sqrt(q.var(-1, keepdims=True) + 1e-5)
  q = (q * p["query_norm"]["scale"] + p["query_norm"]["bias"]).reshape(
      -1, H, KD
  )
  got_s, got_i = pkm.product_key_topk(jnp.asarray(q), p["keys"], K)
  np.testing.assert_allclose(got_s, scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got_i, slots)
  np.testing.assert_allclose(jax.nn.softmax(got_s, -1), w, rtol=1e-5, atol=1e-6)
  # The sown per-slot sums are the reads of the reference: per head, and
  # per token (a slot once per token; the top-1 of the weights summed over
  # heads per slot).
  sums = state[pkm.USAGE_COLLECTION]
  reads = np.bincount(slots.reshape(-1), minlength=C * C)
  np.testing.assert_array_equal(sums["reads_per_head"], reads)
  top1 = np.bincount(slots[..., 0].reshape(-1), minlength=C * C)
  np.testing.assert_array_equal(sums["top1_per_head"], top1)
  tok_reads, tok_top1 = np.zeros(C * C), np.zeros(C * C)
  for ts, tw in zip(slots.reshape(len(xf), -1), w.reshape(len(xf), -1)):
    summed = {}
    for slot, weight in zip(ts, tw):
      summed[int(slot)] = summed.get(int(slot), 0.0) + weight
    tok_reads[list(summed)] += 1
    tok_top1[max(summed, key=lambda j: (summed[j], -j))] += 1
  np.testing.assert_array_equal(sums["reads"], tok_reads)
  np.testing.assert_array_equal(sums["top1"], tok_top1)
  assert tok_top1.sum() == len(xf) < top1.sum()
  wsum = np.bincount(slots.reshape(-1), w.reshape(-1), minlength=C * C)
  np.testing.assert_allclose(sums["weights"], wsum, rtol=1e-5, atol=1e-6)


def test_ties_go_to_the_lower_index():
  rng = np.random.default_rng(0)
  keys = rng.normal(size=(H, 2, C, KD // 2)).astype(np.float32)
  keys[:, 0, 3] = keys[:, 0, 1]  # Sub-keys 1 and 3 tie, and 2 and 5.
  keys[:, 1, 5] = keys[:, 1, 2]
  q = rng.normal(size=(7, H, KD)).astype(np.float32)
  q[0] = 0.0  # Every sum ties: the first k slots in (a, b) order.
  scores, slots = np_lookup(q, keys, K)
  got_s, got_i = pkm.product_key_topk(jnp.asarray(q), jnp.asarray(keys), K)
  np.testing.assert_array_equal(got_i, slots)
  np.testing.assert_allclose(got_s, scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got_i[0, 0], [0, 1, 2])


def test_topk_over_candidate_sums_equals_brute_force():
  rng = np.random.default_rng(1)
  c, k = 16, 5
  keys = rng.normal(size=(H, 2, c, 4)).astype(np.float32)
  q = rng.normal(size=(20, H, 8)).astype(np.float32)
  got_s, got_i = pkm.product_key_topk(jnp.asarray(q), jnp.asarray(keys), k)
  for n in range(len(q)):
    for h in range(H):
      s1 = keys[h, 0] @ q[n, h, :4]
      s2 = keys[h, 1] @ q[n, h, 4:]
      full = (s1[:, None] + s2[None, :]).reshape(-1)  # All C^2 slots.
      best = _np_topk(full, k)
      np.testing.assert_allclose(got_s[n, h], full[best], rtol=1e-5)
      np.testing.assert_array_equal(np.sort(got_i[n, h]), np.sort(best))


@pytest.mark.parametrize("k", [1, 2, 5, 8, 32])
def test_the_candidate_pairs_hold_the_top_k_of_the_whole_grid(k):
  # Sorted scores of the two halves, coarse so that many sums tie: the top
  # k of the candidate pairs are the top k of all k^2 sums, the same pairs
  # in the same order (ties to the lower grid index).
  a, b = pkm.candidate_pairs(k)
  assert len(a) == sum(k // i for i in range(1, k + 1))  # 119 at k = 32.
  assert list(a * k + b) == sorted(a * k + b)
  rng = np.random.default_rng(k)
  v = -np.sort(-np.round(rng.normal(size=(50, 2, k)), 1), axis=-1)
  full = (v[:, 0, :, None] + v[:, 1, None, :]).reshape(50, k * k)
  want_s, want_i = jax.lax.top_k(jnp.asarray(full), k)
  got_s, got = jax.lax.top_k(jnp.asarray(full[:, a * k + b]), k)
  np.testing.assert_array_equal(got_s, want_s)
  np.testing.assert_array_equal((a * k + b)[np.asarray(got)], want_i)


def test_padding_is_ignored_by_batch_norm_and_outputs_zero():
  layer = _layer(query_norm="batch")
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (2, 6, D)))
  mask = np.ones((2, 6), np.float32)
  mask[0, 4:] = 0
  mask[1, 1:] = 0
  xp = x.copy()
  xp[mask == 0] = 1e3  # Padding with wild values.
  variables = layer.init(jax.random.PRNGKey(0), xp, deterministic=True)
  out, state = layer.apply(
      variables, xp, deterministic=False, mask=mask, mutable=["batch_stats"]
  )
  p = _unbox(variables["params"])
  q = x[mask == 1] @ p["query"]["kernel"] + p["query"]["bias"]
  stats_ = state["batch_stats"]["query_norm"]
  np.testing.assert_allclose(
      stats_["mean"], 0.1 * q.mean(0), rtol=1e-4, atol=1e-6
  )
  np.testing.assert_allclose(
      stats_["var"], 0.9 + 0.1 * q.var(0), rtol=1e-4, atol=1e-5
  )
  np.testing.assert_array_equal(np.asarray(out)[mask == 0], 0.0)
  # The real positions alone (no padding at all) give the same outputs.
  alone, _ = layer.apply(
      variables,
      x[mask == 1][None],
      deterministic=False,
      mutable=["batch_stats"],
  )
  np.testing.assert_allclose(
      np.asarray(out)[mask == 1], alone[0], rtol=1e-4, atol=1e-5
  )


def _lm(**kw):
  kind = kw.pop("feed_forward", "pkm")
  return transformer.TransformerLM(
      cfg=helpers.config(
          32,
          num_layers=2,
          d_model=D,
          num_heads=4,
          head_dim=3,
          d_ff=24,
          feed_forward_options=dict(num_keys=C, heads=H, topk=K, k_dim=KD),
          feed_forward_layers=(2,),
          feed_forward=kind,
          **kw,
      )
  )


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_pkm_lm_is_causal(norm_position):
  model = _lm(feed_forward="resm", norm_position=norm_position)
  toks = np.random.default_rng(3).integers(0, 32, (2, 10)).astype(np.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), toks, toks)
  assert "memory" in params["params"]["layer_1"]["ffn"]
  assert "dense" in params["params"]["layer_1"]["ffn"]
  assert "wi" in params["params"]["layer_0"]["ffn"]  # The plain FFN.
  f = jax.jit(lambda t: model.apply(params, t, t).target_logprob)
  base = f(toks)
  later = toks.copy()
  later[:, 6:] = (later[:, 6:] + 5) % 32
  np.testing.assert_array_equal(f(later)[:, :6], base[:, :6])
  assert not np.allclose(f(later)[:, 6:], base[:, 6:])


def test_gradients_reach_only_the_rows_read():
  model = _lm()
  toks = np.random.default_rng(4).integers(0, 32, (2, 5)).astype(np.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), toks, toks)["params"]

  def loss(p):
    out, state = model.apply(
        {"params": p}, toks, toks, mutable=[pkm.USAGE_COLLECTION]
    )
    return -jnp.sum(out.target_logprob), state

  grads, state = jax.jit(jax.grad(loss, has_aux=True))(params)
  reads = state[pkm.USAGE_COLLECTION]["layer_1"]["ffn"]["memory"]["reads"]
  g = nn.meta.unbox(grads["layer_1"]["ffn"]["memory"]["values"])
  touched = np.any(np.asarray(g) != 0, axis=1)
  assert 0 < touched.sum() < C * C
  np.testing.assert_array_equal(touched, np.asarray(reads) > 0)


def _np_sparse_adam(p, m, v, g, t, lr, b1=0.9, b2=0.999, eps=1e-8):
  """PyTorch's SparseAdam on the rows with a non-zero gradient."""
  p, m, v = p.copy(), m.copy(), v.copy()
  rows = np.any(g != 0, axis=1)
  m[rows] = b1 * m[rows] + (1 - b1) * g[rows]
  v[rows] = b2 * v[rows] + (1 - b2) * g[rows] ** 2
  step = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
  p[rows] -= step * m[rows] / (np.sqrt(v[rows]) + eps)
  return p, m, v


# 0: the masked dense update; 5: the gather/scatter of at most 5 rows (the
# steps below read 2, 3 and 5).
@pytest.mark.parametrize("max_rows_read", [0, 5])
def test_lazy_adam_leaves_unread_rows_and_moments_bit_identical(max_rows_read):
  from memjax.methods.pkm import lazy_adam as sparse_adam  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(5)
  p = rng.normal(size=(8, 3)).astype(np.float32)
  tx = sparse_adam.lazy_adam(1e-3, max_rows_read=max_rows_read)
  state = tx.init(p)
  # The unread rows start with moments of their own (from earlier steps).
  state = state._replace(
      mu=jnp.asarray(rng.normal(size=(8, 3)), jnp.float32),
      nu=jnp.asarray(rng.uniform(size=(8, 3)), jnp.float32),
  )
  ref = (p, np.asarray(state.mu), np.asarray(state.nu))
  cur = jnp.asarray(p)
  # The path is chosen when the step is traced: a scatter only with a bound.
  traced = str(jax.make_jaxpr(tx.update)(jnp.zeros((8, 3)), state))
  assert ("scatter" in traced) == (max_rows_read > 0)
  assert "cond" not in traced
  step = jax.jit(tx.update)
  for t, rows in enumerate([[1, 4], [4, 6, 7], [0, 1, 2, 3, 5]], start=1):
    g = np.zeros((8, 3), np.float32)
    g[rows] = rng.normal(size=(len(rows), 3))
    before = (np.asarray(cur), np.asarray(state.mu), np.asarray(state.nu))
    updates, state = step(jnp.asarray(g), state)
    cur = optax.apply_updates(cur, updates)
    ref = _np_sparse_adam(*ref, g, t, 1e-3)
    unread = [r for r in range(8) if r not in rows]
    for new, old in zip((cur, state.mu, state.nu), before):
      np.testing.assert_array_equal(np.asarray(new)[unread], old[unread])
    for new, r in zip((cur, state.mu, state.nu), ref):
      np.testing.assert_allclose(np.asarray(new), r, rtol=1e-5, atol=1e-7)
  assert int(state.count) == 3


def test_lazy_adam_reads_the_rows_numpy_reads():
  # Rows with a non-zero entry, a NaN or an infinity are read; rows of
  # zeros and of -0.0 are not (the row test is a max of magnitudes).
  from memjax.methods.pkm import lazy_adam as sparse_adam  # pylint: disable=g-import-not-at-top

  g = np.zeros((6, 4), np.float32)
  g[1, 2] = 3.0
  g[2, 0] = -1e-30
  g[3, 3] = np.nan
  g[4, 1] = -np.inf
  g[5] = -0.0
  got = np.asarray(jax.jit(sparse_adam._row_mask)(jnp.asarray(g)))
  np.testing.assert_array_equal(got, np.any(g != 0, axis=1))
  assert got.tolist() == [False, True, True, True, True, False]


@pytest.mark.newest
def test_lazy_adam_group_through_make_optimizer_against_numpy():
  # A parameter group of config.optim with the lazy_adam transform, a
  # warm-up and non-default b1, b2, eps: the group's rows follow NumPy's
  # SparseAdam with lr_t = lr * min((t - 1) / warm, 1) at update t (the
  # schedule read at the step count before the update, as optax's Adam
  # does); the other parameter takes the base optimiser.
  from memjax import config as config_lib  # pylint: disable=g-import-not-at-top
  from memjax import settings as settings_lib  # pylint: disable=g-import-not-at-top
  from memjax.run import optim  # pylint: disable=g-import-not-at-top

  cfg = config_lib.base_config().optim
  cfg.clip_norm = 0.0
  cfg.groups.memory = ml_collections.ConfigDict(
      {
          "params": "/memory/values$",
          "transform": "lazy_adam",
          "learning_rate": 0.1,
          "schedule": "constant",
          "warmup_steps": 3,
          "b1": 0.5,
          "b2": 0.75,
          "eps": 0.01,
      }
  )
  tx, _ = optim.make_optimizer(
      settings_lib.read(settings_lib.Optim, cfg),
      num_steps=20,
      transforms=build.parts().optimizer_transforms,
  )
  rng = np.random.default_rng(7)
  p = rng.normal(size=(8, 3)).astype(np.float32)
  params = {"layer_0": {"memory": {"values": jnp.asarray(p)}}, "w": jnp.ones(2)}
  state = tx.init(params)
  ref = (p, np.zeros_like(p), np.zeros_like(p))
  step = jax.jit(tx.update)
  for t, rows in enumerate([[1, 4], [4, 6, 7], [0, 1, 5], [1, 2]], start=1):
    g = np.zeros((8, 3), np.float32)
    g[rows] = rng.normal(size=(len(rows), 3))
    grads = {
        "layer_0": {"memory": {"values": jnp.asarray(g)}},
        "w": jnp.ones(2),
    }
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
    lr = 0.1 * min((t - 1) / 3, 1.0)
    ref = _np_sparse_adam(*ref, g, t, lr, b1=0.5, b2=0.75, eps=0.01)
    np.testing.assert_allclose(
        np.asarray(params["layer_0"]["memory"]["values"]),
        ref[0],
        rtol=1e-5,
        atol=1e-7,
    )
  # The first update (lr 0 at the start of the warm-up) left every row.
  assert not np.allclose(ref[0], p)


def test_the_leak_switch_at_false_keeps_the_signature_of_runs_saved_before(
    tmp_path,
):
  from configs import pkm_wt103  # pylint: disable=g-import-not-at-top
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax.checkpoints import convert  # pylint: disable=g-import-not-at-top

  def signature(config):
    return build.build(config, str(tmp_path)).signature(100)

  config = pkm_wt103.get_config("pkm_smoke")
  opts = config.model.feed_forward_options
  assert opts.allow_batchnorm_future_leak is False
  now = signature(config)
  del opts["allow_batchnorm_future_leak"]  # as every run saved before
  assert signature(config) == now
  # Signature version 3: the switch changes no weight, so it is a runtime
  # option (extend.FeedForward.runtime_options), left out of the signature
  # at either value; a version-2 signature that recorded it set reads as
  # today's.
  opts.allow_batchnorm_future_leak = True
  assert signature(config) == now
  assert (
      "allow_batchnorm_future_leak" not in now["model"]["feed_forward_options"]
  )
  saved = json.loads(json.dumps(now))
  saved["model"]["feed_forward_options"]["allow_batchnorm_future_leak"] = True
  saved["signature_version"] = 2
  assert convert.upgrade(saved) == now


def _np_rms(x):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6)


def test_memory_plus_gate_and_qk_norm_match_numpy():
  """Memory+ (Berges et al.): (PKM(x) ⊙ silu(x W1 + b1)) W2 + b2, with the
  query halves and the sub-keys at unit RMS before the search."""
  options = pkm.MemoryPlusFeedForward.options
  options = dataclasses.replace(options, num_keys=C, heads=H, topk=K, k_dim=KD)
  layer = pkm.MemoryPlusFeedForward(d_model=D, d_ff=24, options=options)
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (2, 4, D)))
  variables = layer.init(jax.random.PRNGKey(0), x, deterministic=True)
  p = _unbox(variables["params"])
  assert set(p) == {"memory", "gate_in", "gate_out"}  # No FFN: it replaces it.
  out = layer.apply(variables, x, deterministic=True)
  m = p["memory"]
  xf = x.reshape(-1, D)
  q = xf @ m["query"]["kernel"] + m["query"]["bias"]
  q = (q - q.mean(-1, keepdims=True)) / np.sqrt(q.var(-1, keepdims=True) + 1e-5)
  q = (q * m["query_norm"]["scale"] + m["query_norm"]["bias"]).reshape(
      -1, H, KD
  )
  q = np.concatenate(
      [_np_rms(q[..., : KD // 2]), _np_rms(q[..., KD // 2 :])], -1
  )
  scores, slots = np_lookup(q, _np_rms(m["keys"]), K)
  w = np.exp(scores - scores.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  read = np.einsum("nhk,nhkv->nv", w, m["values"][slots])
  g = xf @ p["gate_in"]["kernel"] + p["gate_in"]["bias"]
  g = g / (1 + np.exp(-g))
  want = (read * g) @ p["gate_out"]["kernel"] + p["gate_out"]["bias"]
  np.testing.assert_allclose(out.reshape(-1, D), want, rtol=1e-4, atol=1e-5)


def _pool_lm(shared, scan=False):
  return transformer.TransformerLM(
      cfg=helpers.config(
          32,
          num_layers=4,
          d_model=D,
          num_heads=4,
          head_dim=3,
          d_ff=24,
          feed_forward_layers=(2, 3),
          scan_layers=scan,
          feed_forward_options=dict(
              num_keys=C, heads=H, topk=K, k_dim=KD, shared_values=shared
          ),
          feed_forward="pkm",
      )
  )


def test_shared_values_are_one_table_that_both_layers_read():
  """The shared pool (Memory+): one [C^2, D] table, each layer with its
  own queries and keys; it computes what two layers with copies of that
  table compute, and its gradient is the sum of theirs."""
  from memjax.checkpoints import convert  # pylint: disable=g-import-not-at-top

  toks = np.random.default_rng(8).integers(0, 32, (2, 6)).astype(np.int32)
  pooled = _unbox(
      jax.jit(_pool_lm(True).init)(jax.random.PRNGKey(0), toks, toks)
  )
  pooled = pooled["params"]
  paths = [
      jax.tree_util.keystr(k)
      for k, _ in jax.tree_util.tree_leaves_with_path(pooled)
  ]
  assert [p for p in paths if "values" in p] == ["['ffn_shared']['values']"]
  assert {"query", "keys"} <= set(pooled["layer_1"]["ffn"]["memory"])
  table = pooled["ffn_shared"]["values"]
  apart = {k: v for k, v in pooled.items() if k != "ffn_shared"}
  for layer in ("layer_1", "layer_2"):
    apart[layer]["ffn"]["memory"] = dict(
        apart[layer]["ffn"]["memory"], values=table
    )

  def loss(model, p):
    return -jnp.sum(model.apply({"params": p}, toks, toks).target_logprob)

  def value_and_grad(model):
    """Compiled as one program, not one per operation."""
    return jax.jit(jax.value_and_grad(lambda p: loss(model, p)))

  l1, g1 = value_and_grad(_pool_lm(True))(pooled)
  l2, g2 = value_and_grad(_pool_lm(False))(apart)
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  summed = sum(g2[n]["ffn"]["memory"]["values"] for n in ("layer_1", "layer_2"))
  np.testing.assert_allclose(g1["ffn_shared"]["values"], summed, atol=1e-6)
  assert np.count_nonzero(g2["layer_1"]["ffn"]["memory"]["values"]) > 0
  np.testing.assert_allclose(
      g1["layer_2"]["ffn"]["memory"]["keys"],
      g2["layer_2"]["ffn"]["memory"]["keys"],
      rtol=1e-5,
      atol=1e-6,
  )
  # Scanned layers broadcast the one table to the run of memory layers.
  scanned = convert.Layout(current_runs=("layer_1_to_2",)).to_current(pooled)
  assert scanned["ffn_shared"]["values"].shape == (C * C, D)
  l3 = jax.jit(lambda p: loss(_pool_lm(True, scan=True), p))(scanned)
  np.testing.assert_allclose(l1, l3, rtol=1e-6)


def test_shared_values_need_a_family_that_makes_them():
  options = pkm.MemoryOptions(
      num_keys=C, heads=H, topk=K, k_dim=KD, shared_values=True
  )
  layer = pkm.PKMFeedForward(d_model=D, d_ff=24, options=options)
  x = jnp.zeros((1, 3, D))
  with pytest.raises(errors.ConfigError, match="shared_values needs"):
    layer.init(jax.random.PRNGKey(0), x, deterministic=True)


MEMORY_PLUS_OVERRIDES = (
    "--config.model.feed_forward_options.gate=True",
    "--config.model.feed_forward_options.qk_norm=True",
    "--config.model.feed_forward_options.shared_values=True",
)


def test_memory_plus_options_set_on_a_pkm_variant_from_the_command_line():
  """Memory+'s gate, qk_norm and shared_values are in every memory kind's
  options (``MemoryOptions``), so a 'pkm' variant takes them as overrides:
  the command line accepts them, and the model built has the gate and the
  one shared values table."""
  from configs import pkm_wt103  # pylint: disable=g-import-not-at-top
  from memjax import build  # pylint: disable=g-import-not-at-top
  from tests.conftest import run_main  # pylint: disable=g-import-not-at-top

  proc = run_main(
      "--config=configs/pkm_wt103.py:pkm_smoke",
      "--mode=list",
      *MEMORY_PLUS_OVERRIDES,
      timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  config = pkm_wt103.get_config("pkm_smoke")
  config.lock()  # As the command line's: a key the config lacks fails.
  for arg in MEMORY_PLUS_OVERRIDES:
    key, _, value = arg[
        len("--config.model.feed_forward_options.") :
    ].partition("=")
    config.model.feed_forward_options[key] = value == "True"
  run = build.build(config, "unused")
  options = run.settings.model.feed_forward_options
  assert options["gate"] and options["qk_norm"] and options["shared_values"]
  model = run.model(5000)  # Above the smoke size's adaptive cutoffs.
  tokens = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), tokens, tokens)
  )["params"]
  layers = config.model.feed_forward_layers
  for n in range(1, config.model.num_layers + 1):
    ffn = set(shapes[f"layer_{n - 1}"]["ffn"])
    if n in layers:
      assert {"gate_in", "gate_out", "memory"} <= ffn
      assert "values" not in shapes[f"layer_{n - 1}"]["ffn"]["memory"]
    else:
      assert "gate_in" not in ffn
  assert "values" in shapes["ffn_shared"]
