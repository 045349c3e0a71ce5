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

from memjax import build
from memjax import config as config_lib
from memjax.data import token_batching
from memjax.methods.trime import bm25

V = 40
EPS = 0.1


def _loss_config():
  c = config_lib.base_config()
  c.loss.name = "trime_mt"
  c.loss.options.epsilon = EPS
  c.trime.lm_warmup_fraction = 0.0
  c.trime.block_size = 8  # several tiles of the blockwise path
  return c


def _settings(c):
  """The typed settings of config ``c``."""
  return build.read(c, build.parts())


def _objective(name, c, num_steps=100):
  """The loss function of objective ``name`` with config ``c``'s settings."""
  return build.parts().objectives.get(name)(_settings(c), num_steps)


def _batcher(name, c, train, cache_dir):
  """The batcher ``name`` over ``train`` with config ``c``'s settings."""
  return build.parts().batchers.get(name).make(_settings(c), train, cache_dir)


@pytest.fixture(scope="module")
def output_and_batch(tmp_path_factory):
  c = config_lib.base_config()
  m = c.model
  m.family, m.cutoffs, m.max_len = "encoder_decoder", (), 64
  m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 1, 16, 2, 8, 32
  m.family_options.encoder_layers = 1
  m.dropout = 0.0
  model = build.build(c, str(tmp_path_factory.mktemp("mt"))).model(V)
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
  loss_fn = _objective("trime_mt", _loss_config())
  loss, metrics = loss_fn(out, batch, step=jnp.int32(10), rng=None)
  np.testing.assert_allclose(loss, _reference(out, batch), rtol=1e-5)
  assert float(metrics["tokens"]) == batch["weights"].sum()


def test_one_sentence_batch_is_label_smoothed(output_and_batch):
  """A batch of one sentence has an empty memory: label_smoothed exactly."""
  out, batch = output_and_batch
  one = {k: v[:1] for k, v in batch.items()}
  out1 = jax.tree.map(lambda x: x[:1], out)
  smoothed = _objective("label_smoothed", _loss_config())
  ref1, _ = smoothed(out1, one, step=jnp.int32(0), rng=None)
  loss_fn = _objective("trime_mt", _loss_config())
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
  c.trime.bm25_k = 8
  train = types.SimpleNamespace(source=sources, target=targets)
  batcher = _batcher("tokens_bm25", c, train, str(tmp_path))
  assert batcher.num_batches == 4
  seen = []
  for step in range(4):
    rows = [tuple(r[r > 1]) for r in batcher.batch(step)["targets"]]
    topics = {topic[[tuple(t[t > 1]) for t in targets].index(r)] for r in rows}
    assert len(topics) == 1
    seen += rows
  assert len(set(seen)) == 32  # an epoch covers every pair once
  plain = _batcher("tokens", c, train, str(tmp_path))
  mixed = plain.batch(0)["targets"]
  assert len({int(r[0] - 10) // 10 for r in mixed}) > 1
  # The order is cached: a second batcher reads it, and no BM25 search runs.
  assert len(list((tmp_path / "bm25").iterdir())) == 1

  def fail(*args, **kwargs):
    raise AssertionError("recomputed despite the cache")

  for name in ("bm25_neighbours", "pack_from_neighbours"):
    monkeypatch.setattr(bm25, name, fail)
  again = _batcher("tokens_bm25", c, train, str(tmp_path))
  for step in range(4):
    np.testing.assert_array_equal(
        again.batch(step)["targets"], batcher.batch(step)["targets"]
    )


def _authors_trime_mt_loss(out, batch, temp, topk_mem):
  """A NumPy port of princeton-nlp/TRIME's ``TrimeMTLoss`` (machine_translation/
  fairseq/criterions/trime_mt_loss.py): ``compute_in_bacth_logits`` (lines
  102-141, one process), the ``norm_tpc`` step (166-188) and the summed NLL
  (13-26, label smoothing ignored) over the target tokens."""
  g = np.asarray(out.features, np.float64)
  b, length, d = g.shape
  # fairseq's ids: <s> = 0, <pad> = 1, so tokens are shifted past them.
  labels = np.where(batch["weights"] > 0, batch["targets"] + 2, 1).reshape(-1)
  pad = 1
  reps = g.reshape(-1, d)
  keep = labels != 0  # line 112-114: the gather's padding (none here)
  inbatch_reps, inbatch_labels = reps[keep], labels[keep]
  logits = reps @ inbatch_reps.T / np.sqrt(d) / temp  # compute_sim, l. 118
  own = np.kron(np.eye(b), np.ones((length, length))) * -10000.0  # 120-125
  logits = logits + own
  logits[:, inbatch_labels == pad] -= 10000.0  # line 134
  idx = np.argsort(-logits, axis=-1, kind="stable")[:, :topk_mem]  # 136-139
  logits = np.take_along_axis(logits, idx, -1)
  mem_labels = inbatch_labels[idx]

  def lse(x):
    m = x.max(-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[..., 0]

  logs = logits - lse(logits)[:, None]  # lines 179-186
  negatives = labels[:, None] != mem_labels
  ctx = lse(logs + negatives * -10000.0)
  norm_c = lse(logits)
  norm_t = np.asarray(out.log_z, np.float64).reshape(-1)
  lprobs = np.asarray(out.target_logprob, np.float64).reshape(-1)
  norm_tpc = np.logaddexp(norm_t, norm_c)
  norm_lprobs = np.logaddexp(
      lprobs + norm_t - norm_tpc, ctx + norm_c - norm_tpc
  )
  nll = np.where(labels == pad, 0.0, -norm_lprobs)
  return nll.sum() / (labels != pad).sum()


def test_topk_memory_at_temperature_10_matches_the_authors_criterion(
    output_and_batch,
):
  out, batch = output_and_batch
  w = batch["weights"]
  # Each target token sees more than 8 tokens of the other sentences, so
  # top-8 leaves some out.
  lengths = w.sum(1)
  assert (lengths.sum() - lengths > 8).all()

  def loss(temperature, topk):
    c = _loss_config()
    c.loss.options.update(
        epsilon=0.0, temperature=temperature, topk_memory=topk
    )
    fn = _objective("trime_mt", c)
    return float(fn(out, batch, step=jnp.int32(10), rng=None)[0])

  want = _authors_trime_mt_loss(out, batch, 10.0, 8)
  np.testing.assert_allclose(loss(10.0, 8), want, rtol=1e-5)
  np.testing.assert_allclose(
      loss(1.0, 4), _authors_trime_mt_loss(out, batch, 1.0, 4), rtol=1e-5
  )
  for other in (loss(1.0, 8), loss(10.0, 4), loss(10.0, 0)):
    assert abs(other - want) > 1e-4
  # k at least the whole memory: every in-batch token, as topk_memory=0.
  np.testing.assert_allclose(loss(10.0, 64), loss(10.0, 0), rtol=1e-6)


def test_trime_mt_configs_take_the_authors_recipe():
  from configs import trime_iwslt  # pylint: disable=g-import-not-at-top

  c = trime_iwslt.get_config("trime_mt_smoke")
  assert dict(c.loss.options) == {
      "epsilon": 0.0,
      "temperature": 10.0,
      "topk_memory": 8,
  }
  assert c.trime.lm_warmup_fraction == 0.0
  assert c.model.family_options.memory_feature == "final_output"
  mem = c.mt_memory
  assert (mem.k, mem.temperature, mem.unnormalised) == (16, 15.0, False)
  assert 15.0 in mem.temperature_grid and 16 in mem.k_grid
  _objective("trime_mt", c)  # builds
  vanilla = trime_iwslt.get_config("smoke")
  assert "memory_feature" not in vanilla.model.family_options
  assert vanilla.mt_memory.temperature == 1.0


def test_iwslt_paper_configs_decode_with_the_authors_length_penalty():
  from configs import trime_iwslt  # pylint: disable=g-import-not-at-top

  # Their README decodes vanilla, kNN-MT and TrimeMT with --lenpen 0.6.
  for name in ("paper", "trime_mt_paper", "vanilla_paper"):
    tr = trime_iwslt.get_config(name).translation
    assert (tr.beam_size, tr.length_penalty) == (4, 0.6), name
  for name in ("smoke", "demo", "trime_mt_demo"):
    assert trime_iwslt.get_config(name).translation.length_penalty == 1.0


def test_trime_mt_paper_config_is_the_authors_architecture():
  from configs import trime_iwslt  # pylint: disable=g-import-not-at-top

  # --decoder-normalize-before only: post-LN encoder, pre-LN decoder, g
  # after the decoder's final LayerNorm (knn_embed).
  m = trime_iwslt.get_config("trime_mt_paper").model
  assert m.norm_position == "post"
  assert dict(m.family_options) == {
      "encoder_layers": 6,
      "memory_feature": "final_output",
      "decoder_norm_position": "pre",
  }
  vanilla = trime_iwslt.get_config("paper").model
  assert "decoder_norm_position" not in vanilla.family_options


def test_trime_mt_trains_and_decodes_with_its_memory_through_main(tmp_path):
  """TRIMEMT (top-k in-batch memory, the authors' criterion) trained
  through python -m memjax.main, then TRIMEMT_ext: a datastore of its
  features and a decode with the joint softmax over the neighbours."""
  from tests.conftest import run_main  # pylint: disable=g-import-not-at-top

  flags = (
      "--config=configs/trime_iwslt.py:trime_mt_smoke",
      f"--workdir={tmp_path / 'run'}",
      "--config.train.num_steps=4",
      "--config.translation.eval_max_sentences=4",
      "--config.translation.buckets=(32,)",
      "--config.translation.max_len_a=0.0",
      "--config.translation.max_len_b=6",
      "--config.mt_memory.k=8",
      "--config.mt_memory.search=exact",
  )
  proc = run_main(*flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "valid: BLEU" in proc.stdout
  for mode in ("mt_datastore", "mt_translate"):
    proc = run_main(*flags, f"--mode={mode}")
    assert proc.returncode == 0, (mode, proc.stderr[-3000:])
  assert "test (trime memory): BLEU" in proc.stdout
  lines = (tmp_path / "run" / "translations" / "test.trime.txt").read_text()
  assert len(lines.split("\n")) == 5  # Four sentences and the last newline.
