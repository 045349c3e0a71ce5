"""Adaptive input and softmax: distributions, one-cluster case, chunking."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.models import adaptive


def _init(module, h, y):
  return nn.meta.unbox(
      module.init(jax.random.PRNGKey(0), h, y, method=module.score)
  )


@pytest.mark.parametrize("cutoffs", [(), (5,), (10, 30), (3, 20, 60)])
def test_probabilities_sum_to_one_and_match_score(cutoffs):
  m = adaptive.AdaptiveEmbed(
      vocab_size=80, d_model=16, cutoffs=cutoffs, factor=2
  )
  h = jax.random.normal(jax.random.PRNGKey(1), (3, 7, 16))
  y = jax.random.randint(jax.random.PRNGKey(2), (3, 7), 0, 80)
  v = _init(m, h, y)
  lp = m.apply(v, h, method=m.log_probs)
  np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0, rtol=1e-5)
  score, log_z = m.apply(v, h, y, method=m.score)
  np.testing.assert_allclose(
      score,
      np.take_along_axis(np.asarray(lp), np.asarray(y)[..., None], -1)[..., 0],
      rtol=1e-5,
      atol=1e-5,
  )
  assert np.all(np.isfinite(log_z))


def test_one_cluster_is_plain_tied_softmax():
  m = adaptive.AdaptiveEmbed(vocab_size=40, d_model=8, cutoffs=())
  h = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
  y = jax.random.randint(jax.random.PRNGKey(2), (2, 5), 0, 40)
  v = _init(m, h, y)
  table = np.asarray(v["params"]["embed_0"], np.float64)
  logits = np.asarray(h, np.float64) @ table.T
  log_z = np.log(np.exp(logits).sum(-1))
  expected = (
      np.take_along_axis(logits, np.asarray(y)[..., None], -1)[..., 0] - log_z
  )
  score, lz = m.apply(v, h, y, method=m.score)
  np.testing.assert_allclose(score, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(lz, log_z, rtol=1e-5)
  # Embedding is the same tied table.
  e = m.apply(v, y, method=m.embed)
  np.testing.assert_allclose(e, table[np.asarray(y)], rtol=1e-6)


def test_head_and_tail_factorisation_by_hand():
  """log p(y) for a tail token = head log-prob of its cluster + tail log-prob."""
  m = adaptive.AdaptiveEmbed(vocab_size=12, d_model=4, cutoffs=(4, 8), factor=2)
  h = jax.random.normal(jax.random.PRNGKey(3), (1, 1, 4))
  y = jnp.array([[9]])
  v = _init(m, h, y)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), v["params"])
  hv = np.asarray(h, np.float64)[0, 0]
  head = np.concatenate(
      [(hv @ p["proj_0"].T) @ p["embed_0"].T, hv @ p["cluster_weight"]]
  )
  head_lp = head - np.log(np.exp(head).sum())
  tail = (hv @ p["proj_2"].T) @ p["embed_2"].T
  tail_lp = tail - np.log(np.exp(tail).sum())
  expected = head_lp[4 + 1] + tail_lp[9 - 8]
  score, _ = m.apply(v, h, y, method=m.score)
  np.testing.assert_allclose(score[0, 0], expected, rtol=1e-5)


def test_chunked_scoring_equals_unchunked_with_gradients():
  kw = dict(vocab_size=50, d_model=8, cutoffs=(10, 30), factor=2)
  big = adaptive.AdaptiveEmbed(**kw, chunk_size=1000)
  small = adaptive.AdaptiveEmbed(**kw, chunk_size=7)
  h = jax.random.normal(jax.random.PRNGKey(1), (3, 11, 8))
  y = jax.random.randint(jax.random.PRNGKey(2), (3, 11), 0, 50)
  v = _init(big, h, y)

  def loss(params, mod):
    return -mod.apply({"params": params}, h, y, method=mod.score)[0].sum()

  l1, g1 = jax.value_and_grad(loss)(v["params"], big)
  l2, g2 = jax.value_and_grad(loss)(v["params"], small)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      g1,
      g2,
  )


@pytest.mark.parametrize(
    "rows,positions,chunk_size,want",
    [
        (64, 150, 4096, (50, 3)),  # Transformer-XL base: not 3 x 64.
        (8, 150, 4096, (150, 1)),  # One chunk holds them all.
        (64, 151, 4096, (51, 3)),  # One padded position per chunk.
        (3, 11, 7, (2, 6)),  # At least one position of each row.
        (1, 10, 4, (4, 3)),
    ],
)
def test_chunks_are_balanced(rows, positions, chunk_size, want):
  assert adaptive.chunk_layout(rows, positions, chunk_size) == want


def test_chunks_hold_at_most_the_chunk_size_and_one_pad_each():
  for rows in (1, 3, 8, 64):
    for positions in range(1, 200, 7):
      for chunk_size in (1, 7, 64, 4096):
        chunk, chunks = adaptive.chunk_layout(rows, positions, chunk_size)
        most = max(1, chunk_size // rows)
        assert chunk <= max(most, 1) or chunks == 1
        assert chunks == -(-positions // most)  # The fewest that hold them.
        assert 0 <= chunk * chunks - positions < chunks


def test_balanced_chunks_score_as_one_chunk():
  # 150 positions of 2 rows at 128 tokens: 3 chunks of 50 (64 each before,
  # padded to 192); scores and normalisers equal one chunk's.
  kw = dict(vocab_size=50, d_model=8, cutoffs=(10, 30), factor=2)
  one = adaptive.AdaptiveEmbed(**kw, chunk_size=10_000)
  chunked = adaptive.AdaptiveEmbed(**kw, chunk_size=128)
  assert chunked.chunk_positions(2, 150) == 50
  h = jax.random.normal(jax.random.PRNGKey(3), (2, 150, 8))
  y = jax.random.randint(jax.random.PRNGKey(4), (2, 150), 0, 50)
  v = _init(one, h, y)
  want = one.apply(v, h, y, method=one.score)
  got = chunked.apply(v, h, y, method=chunked.score)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_bad_cutoffs_raise():
  with pytest.raises(ValueError, match="cutoffs"):
    adaptive.cluster_bounds(10, (5, 3))
  with pytest.raises(ValueError, match="cutoffs"):
    adaptive.cluster_bounds(10, (10,))


def test_tail_dropout_touches_only_tail_clusters_in_training():
  kw = dict(vocab_size=50, d_model=16, cutoffs=(10, 30), factor=2)
  plain = adaptive.AdaptiveEmbed(**kw)
  drop = adaptive.AdaptiveEmbed(**kw, tail_dropout=0.5, chunk_size=7)
  h = jax.random.normal(jax.random.PRNGKey(1), (3, 11, 16))
  y = jax.random.randint(jax.random.PRNGKey(2), (3, 11), 0, 50)
  v = _init(plain, h, y)
  ref, ref_z = plain.apply(v, h, y, method=plain.score)
  # Evaluation: the dropout module scores exactly as the plain one.
  ev, ev_z = drop.apply(v, h, y, True, method=drop.score)
  np.testing.assert_allclose(ev, ref, rtol=1e-6)

  def train(seed):
    return drop.apply(
        v,
        h,
        y,
        False,
        method=drop.score,
        rngs={"dropout": jax.random.PRNGKey(seed)},
    )

  tr, tr_z = train(0)
  head = np.asarray(y) < 10
  # fairseq's adaptive-softmax dropout sits inside the tail clusters only:
  # head tokens and the head's normaliser are untouched.
  np.testing.assert_allclose(np.asarray(tr)[head], np.asarray(ref)[head])
  np.testing.assert_allclose(tr_z, ref_z, rtol=1e-6)
  np.testing.assert_allclose(ev_z, ref_z, rtol=1e-6)
  tail = ~head
  assert tail.sum() > 5
  assert np.all(np.asarray(tr)[tail] != np.asarray(ref)[tail])
  # Reproducible for one key, different for another.
  np.testing.assert_array_equal(tr, train(0)[0])
  assert np.any(np.asarray(train(1)[0])[tail] != np.asarray(tr)[tail])


@pytest.mark.parametrize(
    "dtype,atol", [(jnp.float32, 1e-6), (jnp.bfloat16, 2e-2)]
)
def test_narrow_log_softmax_stats_against_numpy(dtype, atol):
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 9)) * 3
  index = jnp.array([[0, 8, 3], [3, 5, 1]])
  g = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 3))
  x = np.asarray(logits.astype(dtype).astype(jnp.float32), np.float64)
  lse = np.log(np.exp(x).sum(-1))
  lp = x - lse[..., None]
  want = (
      np.take_along_axis(lp, np.asarray(index)[..., None], -1)[..., 0],
      lse,
      lp.mean(-1),
  )
  # d/dx of sum(g_t lp_i + g_z lse + g_m mean(lp)), term by term by hand.
  p = np.exp(lp)
  onehot = np.eye(9)[np.asarray(index)]
  gt, gz, gm = (np.asarray(a)[..., None] for a in g)
  want_grad = gt * (onehot - p) + gz * p + gm * (1 / 9 - p)

  def f(z):
    out = adaptive.narrow_log_softmax_stats(z, index)
    return sum(jnp.sum(a * b) for a, b in zip(g, out))

  got = adaptive.narrow_log_softmax_stats(logits.astype(dtype), index)
  for a, b in zip(got, want):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(a, b, atol=1e-5)
  grad = jax.grad(f)(logits.astype(dtype))
  assert grad.dtype == dtype
  np.testing.assert_allclose(grad.astype(jnp.float32), want_grad, atol=atol)


def test_bfloat16_score_follows_float32_with_its_gradient():
  """A bfloat16 module's tail goes through ``narrow_log_softmax_stats``;
  its scores and gradients stay within bfloat16 rounding of float32's."""
  kw = dict(vocab_size=60, d_model=16, cutoffs=(10, 30), factor=2)
  f32 = adaptive.AdaptiveEmbed(**kw)
  bf16 = adaptive.AdaptiveEmbed(**kw, dtype=jnp.bfloat16)
  h = jax.random.normal(jax.random.PRNGKey(1), (3, 7, 16))
  y = jnp.arange(21).reshape(3, 7) * 3 % 60  # Every cluster has targets.
  v = _init(f32, h, y)

  def loss(params, mod):
    return -mod.apply({"params": params}, h, y, method=mod.score)[0].mean()

  l1, g1 = jax.value_and_grad(loss)(v["params"], f32)
  l2, g2 = jax.value_and_grad(loss)(v["params"], bf16)
  np.testing.assert_allclose(l2, l1, rtol=2e-2)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(
          b, a, atol=2e-2 * np.abs(a).max()
      ),
      g1,
      g2,
  )
