"""TRIMEMT_ext training: the loss against a NumPy reference of Eq. 5 on the
decoder's features (memory = the other target sentences of the batch,
label smoothing on the vocabulary term), an empty memory is label_smoothed,
and BM25 packing over targets."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax import config as config_lib
from memjax import experiment
from memjax import registry
from memjax.data import token_batching
from memjax.methods.trime import bm25

V = 40
EPS = 0.1


def _loss_config():
  c = config_lib.base_config()
  c.loss.name = "trime_mt"
  c.loss.options.epsilon = EPS
  c.loss.lm_warmup_fraction = 0.0
  c.loss.block_size = 8  # several tiles of the blockwise path
  return c.loss


@pytest.fixture(scope="module")
def output_and_batch():
  c = config_lib.base_config()
  m = c.model
  m.family, m.cutoffs, m.max_len = "encoder_decoder", (), 64
  m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 1, 16, 2, 8, 32
  m.family_options.encoder_layers = 1
  m.dropout = 0.0
  model = experiment.build_model(m, V)
  rng = np.random.default_rng(0)
  # Few token types, so many memory entries share the query's target.
  src = [np.append(rng.integers(3, 9, n), 1) for n in (5, 3, 6)]
  tgt = [np.append(rng.integers(3, 9, n), 1) for n in (6, 4, 3)]
  batch = token_batching.make_pair_batch(src, tgt, 8, 8)
  init = jax.jit(model.init)
  params = nn.meta.unbox(
      init(jax.random.PRNGKey(1), jnp.zeros((1, 4), jnp.int32))["params"]
  )
  apply = jax.jit(
      lambda p, b: model.apply(
          {"params": p}, b["inputs"], b["targets"], source=b["source"]
      )
  )
  out = apply(params, batch)
  return out, batch


def _reference(out, batch):
  """Eq. 5 with memory = other rows, then fairseq's label smoothing."""
  g = np.asarray(out.features, np.float64)
  tlp = np.asarray(out.target_logprob, np.float64)
  lz = np.asarray(out.log_z, np.float64)
  mean = np.asarray(out.mean_logprob, np.float64)
  y, w = batch["targets"], batch["weights"]
  b, t, d = g.shape
  eps_i = EPS / (V - 1)
  total = 0.0
  for i in range(b):
    for s in range(t):
      if w[i, s] == 0:
        continue
      num, den = np.exp(lz[i, s] + tlp[i, s]), np.exp(lz[i, s])
      for j in range(b):
        for r in range(t):
          if j == i or w[j, r] == 0:
            continue
          e = np.exp(g[i, s] @ g[j, r] / np.sqrt(d))
          den += e
          num += e if y[j, r] == y[i, s] else 0.0
      nll = -np.log(num / den)
      total += (1 - EPS - eps_i) * nll + eps_i * (-mean[i, s] * V)
  return total / w.sum()


def test_loss_matches_numpy_eq5(output_and_batch):
  out, batch = output_and_batch
  loss_fn = registry.OBJECTIVES.get("trime_mt")(_loss_config(), 100)
  loss, metrics = loss_fn(out, batch, step=jnp.int32(10), rng=None)
  np.testing.assert_allclose(loss, _reference(out, batch), rtol=1e-5)
  assert float(metrics["tokens"]) == batch["weights"].sum()


def test_one_sentence_batch_is_label_smoothed(output_and_batch):
  """A batch of one sentence has an empty memory: label_smoothed exactly."""
  out, batch = output_and_batch
  one = {k: v[:1] for k, v in batch.items()}
  out1 = jax.tree.map(lambda x: x[:1], out)
  smoothed = registry.OBJECTIVES.get("label_smoothed")(_loss_config(), 100)
  ref1, _ = smoothed(out1, one, step=jnp.int32(0), rng=None)
  loss_fn = registry.OBJECTIVES.get("trime_mt")(_loss_config(), 100)
  loss1, _ = loss_fn(out1, one, step=jnp.int32(50), rng=None)
  np.testing.assert_allclose(loss1, ref1, rtol=1e-6)


def test_bm25_packing_over_targets_groups_similar_targets(
    tmp_path, monkeypatch
):
  """Four topics of 8 targets with disjoint words: every batch of 8 rows
  (the 8 fake devices) holds one topic; the plain batcher mixes them."""
  rng = np.random.default_rng(0)
  targets, sources, topic = [], [], []
  for i in range(32):
    words = 10 + 10 * (i % 4) + rng.choice(10, 5, replace=False)
    targets.append(np.append(words, 1).astype(np.int32))
    sources.append(np.array([3, 4, 1], np.int32))
    topic.append(i % 4)
  c = config_lib.base_config()
  c.translation.max_tokens, c.translation.buckets = 8 * 8, (8,)
  c.data.bm25_k = 8
  train = types.SimpleNamespace(source=sources, target=targets)
  batcher = registry.BATCHERS.get("tokens_bm25")(c, train, str(tmp_path))
  assert batcher.num_batches == 4
  seen = []
  for step in range(4):
    rows = [tuple(r[r > 1]) for r in batcher.batch(step)["targets"]]
    topics = {topic[[tuple(t[t > 1]) for t in targets].index(r)] for r in rows}
    assert len(topics) == 1
    seen += rows
  assert len(set(seen)) == 32  # an epoch covers every pair once
  plain = registry.BATCHERS.get("tokens")(c, train, str(tmp_path))
  mixed = plain.batch(0)["targets"]
  assert len({int(r[0] - 10) // 10 for r in mixed}) > 1
  # The order is cached: a second batcher reads it, and no BM25 search runs.
  assert len(list((tmp_path / "bm25").iterdir())) == 1

  def fail(*args, **kwargs):
    raise AssertionError("recomputed despite the cache")

  for name in ("bm25_neighbours", "pack_from_neighbours"):
    monkeypatch.setattr(bm25, name, fail)
  again = registry.BATCHERS.get("tokens_bm25")(c, train, str(tmp_path))
  for step in range(4):
    np.testing.assert_array_equal(
        again.batch(step)["targets"], batcher.batch(step)["targets"]
    )
