"""Decoding with an external memory through beam search's hook: kNN-MT at
lam = 0 and the joint softmax with an empty memory are the plain decoder;
beam 1 with memory is greedy with memory; a memory that holds one token
decides every step; the hook's distributions against NumPy."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax import build
from memjax import config as config_lib
from memjax.data import token_batching
from memjax.memory import datastore as ds_lib
from memjax.memory import search as search_lib
from memjax.tasks.translation import decoding
from memjax.methods.external import memory_decoding as md
from memjax.methods.external import mt_datastore

V, D, K, MAX_LEN = 40, 16, 8, 9


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  c = config_lib.base_config()
  m = c.model
  m.family, m.cutoffs, m.max_len = "encoder_decoder", (), 64
  m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 1, D, 2, 8, 32
  m.family_options.encoder_layers = 1
  m.dropout = 0.0
  model = build.build(c, str(tmp_path_factory.mktemp("mt_model"))).model(V)
  params = nn.meta.unbox(
      jax.jit(model.init)(jax.random.PRNGKey(2), jnp.zeros((1, 4), jnp.int32))[
          "params"
      ]
  )
  rng = np.random.default_rng(3)
  src = [np.append(rng.integers(3, V, n), 1) for n in (5, 7, 4, 6)]
  tgt = [np.append(rng.integers(3, V, n), 1) for n in (6, 5, 7, 4)]
  batch = token_batching.make_pair_batch(src, tgt, 8, 8)
  batch["index"] = np.arange(4, dtype=np.int32)
  out = jax.jit(mt_datastore.make_teacher_forced_fn(model))(params, batch)
  ok = out["weights"].reshape(-1) > 0
  keys = np.asarray(out["g"]).reshape(-1, D)[ok]
  values = np.asarray(out["targets"]).reshape(-1)[ok]
  root = tmp_path_factory.mktemp("mt_memory")
  store = ds_lib.from_arrays(str(root / "ds"), keys, values, signature={})
  source = jnp.asarray(token_batching.pad_rows(src[:3], 8))
  return model, params, store, source


def _hook(store, kind, k=K, **settings):
  base = {"knn_lambda": 0.2, "knn_temperature": 10.0, "temperature": 1.0}
  base.update(settings)
  searcher = None
  if store is not None:
    searcher = search_lib.ExactSearcher(store, md.metric_of(kind))
  return md.MemoryHook(kind, base, mt_datastore.Neighbours(searcher, k), k, D)


def _beam(setup, hook, beam=4):
  model, params, _, source = setup
  return decoding.beam_search(model, params, source, MAX_LEN, beam, hook=hook)


@pytest.fixture(scope="module")
def plain(setup):
  return _beam(setup, None)


def test_knn_at_lambda_zero_is_plain_decoding(setup, plain):
  zero = _beam(setup, _hook(setup[2], "knn", knn_lambda=0.0))
  np.testing.assert_array_equal(zero.hypotheses, plain.hypotheses)
  np.testing.assert_array_equal(zero.scores, plain.scores)


def test_joint_softmax_with_empty_memory_is_plain_decoding(setup, plain):
  empty = _beam(setup, _hook(None, "trime"))
  np.testing.assert_array_equal(empty.hypotheses, plain.hypotheses)
  np.testing.assert_allclose(empty.scores, plain.scores, atol=1e-5)


def test_memory_beam_one_is_memory_greedy(setup):
  model, params, store, source = setup
  hook = _hook(store, "trime", temperature=0.5)
  greedy = decoding.greedy_search(model, params, source, MAX_LEN, hook)
  beam = decoding.beam_search(model, params, source, MAX_LEN, 1, hook=hook)
  np.testing.assert_array_equal(beam.tokens, greedy)


def test_a_memory_of_one_token_takes_decoding_over(setup, tmp_path):
  # Every key holds token 7; kNN-MT at lam = 0.999 gives p(7) >= 0.999 and
  # every other token at most 0.001, so each step picks 7 until the length
  # limit forces EOS (beam 1: a hypothesis finishes only at its top token).
  model, params, store, source = setup
  keys = np.concatenate(store.keys).astype(np.float32)
  sevens = ds_lib.from_arrays(
      str(tmp_path / "sevens"),
      keys,
      np.full(len(keys), 7, np.int32),
      signature={},
  )
  out = _beam(setup, _hook(sevens, "knn", knn_lambda=0.999), beam=1)
  want = np.array([7] * (MAX_LEN - 1) + [decoding.EOS])
  np.testing.assert_array_equal(
      out.tokens, np.broadcast_to(want, out.tokens.shape)
  )


def test_hook_distributions_against_numpy():
  rng = np.random.default_rng(0)
  n, k = 3, 5
  logits = rng.normal(size=(n, V)).astype(np.float32)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  g = rng.normal(size=(n, D)).astype(np.float32)
  keys = rng.normal(size=(n, k, D)).astype(np.float32)
  vals = rng.integers(0, 6, (n, k)).astype(np.int32)
  dots = np.einsum("nd,nkd->nk", g, keys)
  l2 = -np.sum((keys - g[:, None]) ** 2, -1)

  def fixed(scores):
    return lambda q: (scores.astype(np.float32), vals)

  # kNN-MT: lam p_kNN + (1 - lam) p_MT, softmax(-L2 / T).
  hook = md.MemoryHook(
      "knn", {"knn_lambda": 0.3, "knn_temperature": 7.0}, fixed(l2), k, D
  )
  got = np.exp(jax.jit(hook)(jnp.asarray(logp), jnp.asarray(g), 0))
  w = np.exp(l2 / 7.0) / np.exp(l2 / 7.0).sum(-1, keepdims=True)
  p_knn = np.zeros((n, V))
  for i in range(n):
    np.add.at(p_knn[i], vals[i], w[i])
  np.testing.assert_allclose(
      got, 0.3 * p_knn + 0.7 * np.exp(logp), rtol=1e-4, atol=1e-7
  )
  # Joint softmax: (exp(s_v) + sum_{y_j = v} exp(m_j)) / (Z + sum exp(m_j)).
  hook = md.MemoryHook("trime", {"temperature": 2.0}, fixed(dots), k, D)
  log_z = np.log(np.exp(logits).sum(-1))
  args = (jnp.asarray(logp), jnp.asarray(g), 0, jnp.asarray(log_z))
  got = np.exp(jax.jit(hook)(*args))
  m = np.exp(dots / (np.sqrt(D) * 2.0))
  num = np.exp(logits)
  for i in range(n):
    np.add.at(num[i], vals[i], m[i])
  want = num / (np.exp(logits).sum(-1) + m.sum(-1))[:, None]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


def numpy_target_prob(
    kind, settings, tlp, log_z, scores, values, targets, dim=D
):
  """p(target) [Q] of ``md.target_log_probs`` in float64 NumPy, row by row.

  kNN-MT: lam p_kNN + (1 - lam) p_MT with p_kNN = softmax(score / T) summed
  over the neighbours holding the target; joint softmax: (exp(s_y) +
  sum_{y_j = y} exp(m_j)) / (Z + sum_j exp(m_j)), m_j = score / (sqrt(D)
  tau); interpolate: softmax(m) summed likewise, mixed with a fixed lam.
  No neighbour (every score -inf): p_MT.
  """
  out = []
  for q in range(len(tlp)):
    p_mt = np.exp(np.float64(tlp[q]))
    ok = np.isfinite(scores[q])
    if not ok.any():
      out.append(p_mt)
      continue
    s = np.float64(scores[q][ok])
    hit = values[q][ok] == targets[q]
    if kind == "knn":
      w = np.exp(s / settings["knn_temperature"])
      lam = settings["knn_lambda"]
      out.append(lam * w[hit].sum() / w.sum() + (1 - lam) * p_mt)
      continue
    m = np.exp(s / (np.sqrt(dim) * settings["temperature"]))
    if settings.get("interpolate"):
      lam = settings["lambda"]
      out.append(lam * m[hit].sum() / m.sum() + (1 - lam) * p_mt)
      continue
    z = np.exp(np.float64(log_z[q]))
    out.append((p_mt * z + m[hit].sum()) / (z + m.sum()))
  return np.asarray(out)


SETTINGS = [
    ("knn", {"knn_lambda": 0.3, "knn_temperature": 7.0}),
    ("knn", {"knn_lambda": 0.3, "knn_temperature": 0.5}),
    ("trime", {"temperature": 2.0}),
    ("trime", {"temperature": 0.5, "interpolate": True, "lambda": 0.4}),
]


def _teacher_forced_case(seed=1, q=6, k=5):
  """Random logits, neighbours and targets; row 4 has no neighbour, row 5
  only two, and row 0's target is held by no neighbour."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(q, V)).astype(np.float32)
  log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  logp = (logits - log_z[:, None]).astype(np.float32)
  g = rng.normal(size=(q, D)).astype(np.float32)
  scores = (rng.normal(size=(q, k)) * 3).astype(np.float32)
  scores[4], scores[5, 2:] = -np.inf, -np.inf
  values = rng.integers(3, 7, (q, k)).astype(np.int32)
  targets = values[:, 0].copy()
  targets[0] = 9
  return logp, log_z.astype(np.float32), g, scores, values, targets


@pytest.mark.parametrize("kind, settings", SETTINGS)
def test_target_log_probs_against_numpy(kind, settings):
  logp, log_z, _, scores, values, targets = _teacher_forced_case()
  tlp = logp[np.arange(len(targets)), targets]
  got = md.target_log_probs(
      kind,
      settings,
      jnp.asarray(tlp),
      jnp.asarray(log_z),
      jnp.asarray(scores),
      jnp.asarray(values),
      jnp.asarray(targets),
      D,
  )
  want = numpy_target_prob(kind, settings, tlp, log_z, scores, values, targets)
  np.testing.assert_allclose(np.exp(got), want, rtol=1e-5, atol=1e-8)
  assert got[4] == tlp[4]  # no neighbour: the plain decoder's score


def test_target_log_probs_depend_on_the_temperature():
  logp, log_z, _, scores, values, targets = _teacher_forced_case()
  tlp = logp[np.arange(len(targets)), targets]
  got = {}
  for t in (0.5, 7.0):
    got[t] = md.target_log_probs(
        "knn",
        {"knn_lambda": 0.3, "knn_temperature": t},
        tlp,
        log_z,
        scores,
        values,
        targets,
        D,
    )
  assert np.all(np.abs(got[0.5] - got[7.0])[[1, 2, 3]] > 1e-3)


@pytest.mark.parametrize("kind, settings", SETTINGS)
def test_teacher_forced_score_is_the_hooks_log_prob_of_the_target(
    kind, settings
):
  # For the same neighbours, scoring a target by teacher forcing (what
  # mt_tune tunes) equals the beam hook's log-probability of that token.
  logp, log_z, g, scores, values, targets = _teacher_forced_case()
  hook = md.MemoryHook(
      kind, settings, lambda q: (scores, values), scores.shape[1], D
  )
  args = (jnp.asarray(logp), jnp.asarray(g), 0)
  if hook.takes_log_z:
    args += (jnp.asarray(log_z),)
  full = np.asarray(jax.jit(hook)(*args))
  rows = np.arange(len(targets))
  got = md.target_log_probs(
      kind, settings, logp[rows, targets], log_z, scores, values, targets, D
  )
  np.testing.assert_allclose(got, full[rows, targets], rtol=1e-5, atol=1e-6)


def _authors_trime_decoding(logits, dots, vals, temp):
  """A NumPy port of the authors' decoding with ``knn_lambda_type`` 'trime'
  (princeton-nlp/TRIME machine_translation/fairseq/models/transformer.py
  940-946, 979-980 and 1230-1235; ``knn_datastore.calculate_knn_prob``
  366-381): probabilities [N, V]."""
  t = temp * np.sqrt(D)  # line 941
  norm_t = np.log(np.exp(logits).sum(-1, keepdims=True))
  norm_c = np.log(np.exp(dots / t).sum(-1, keepdims=True))
  knn_lambda = np.exp(norm_c - np.logaddexp(norm_t, norm_c))
  w = np.exp(dots / t) / np.exp(dots / t).sum(-1, keepdims=True)
  knn_probs = np.zeros(logits.shape)
  for i in range(len(logits)):
    np.add.at(knn_probs[i], vals[i], w[i])
  network = np.exp(logits - norm_t)
  return network * (1 - knn_lambda) + knn_probs  # line 1235


def test_unnormalised_decoding_is_the_authors_and_default_eq_6():
  rng = np.random.default_rng(4)
  n, k, temp = 3, 16, 15.0
  logits = rng.normal(size=(n, V)) * 2.0
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  g = rng.normal(size=(n, D)).astype(np.float32)
  dots = rng.normal(size=(n, k)) * 8.0
  vals = rng.integers(0, 6, (n, k)).astype(np.int32)
  log_z = np.log(np.exp(logits).sum(-1))
  want = _authors_trime_decoding(logits, dots, vals, temp)
  out = {}
  for flag in (False, True):
    hook = md.MemoryHook(
        "trime",
        {"temperature": temp, "unnormalised": flag},
        lambda q: (dots.astype(np.float32), vals),
        k,
        D,
    )
    args = (
        jnp.asarray(logp, jnp.float32),
        jnp.asarray(g),
        0,
        jnp.asarray(log_z, jnp.float32),
    )
    out[flag] = np.exp(np.asarray(jax.jit(hook)(*args), np.float64))
  np.testing.assert_allclose(out[True], want, rtol=1e-4, atol=1e-7)
  # The authors' scores sum to 2 - lam; the default is Eq. 6, normalised,
  # and their memory term times lam.
  lam = 1 - (out[True].sum(-1) - 1)
  np.testing.assert_allclose(out[False].sum(-1), 1.0, rtol=1e-5)
  mt = np.exp(logp) * (1 - lam[:, None])
  np.testing.assert_allclose(
      out[False], mt + lam[:, None] * (want - mt), rtol=1e-4, atol=1e-7
  )
  # Teacher-forced: the same, for the target token only.
  targets = vals[:, 0]
  tf = md.target_log_probs(
      "trime",
      {"temperature": temp, "unnormalised": True},
      jnp.asarray(logp[np.arange(n), targets], jnp.float32),
      jnp.asarray(log_z, jnp.float32),
      jnp.asarray(dots, jnp.float32),
      jnp.asarray(vals),
      jnp.asarray(targets),
      D,
  )
  np.testing.assert_allclose(np.exp(tf), want[np.arange(n), targets], rtol=1e-4)
