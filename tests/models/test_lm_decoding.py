"""Key/value-cache decoding (memjax.models.lm_decoding) against the
model's full forward pass and Hugging Face's stored greedy continuations."""

import os

import jax
import numpy as np
import pytest

import memjax
from memjax import errors
from memjax.models import decode_prompts
from memjax.models import decode_windows
from memjax.models import lm_decoding
from memjax.models import sampling as sampling_lib
from memjax.models import variables as model_vars
from memjax.models import transformer
from tests.conftest import REPO
from tests.models import helpers

FIXTURES = os.path.join(REPO, "tests", "fixtures", "pretrained")


def _full_log_probs(model, variables, tokens):
  """[n, V] log-probabilities of the full forward over [n] tokens."""

  def fn(mdl, x):
    return mdl.log_probs(mdl(x, None, None, deterministic=True).hidden)

  x = np.asarray(tokens, np.int32)[None]
  out = model.apply(model_vars.as_variables(variables), x, method=fn)
  return np.asarray(out[0])


def _check_forced(model, variables, prompts, forced):
  """Cached teacher-forced log-probabilities equal the full forward's."""
  dec = lm_decoding.CachedDecoder(model)
  got = dec.forced_log_probs(variables, prompts, forced)
  for b, prompt in enumerate(prompts):
    seq = np.concatenate([prompt, forced[b]])
    want = _full_log_probs(model, variables, seq)[len(prompt) - 1 :]
    np.testing.assert_allclose(got[b], want, atol=1e-5, rtol=0)


def test_a_tiny_sinusoid_lm_decodes_as_it_scores():
  model = transformer.TransformerLM(cfg=helpers.tiny(32, num_layers=2))
  x = np.zeros((1, 8), np.int32)
  variables = helpers.random_params(model, x, None)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 32, n) for n in (5, 2, 9)]
  forced = rng.integers(0, 32, (3, 6))
  _check_forced(model, variables, prompts, forced)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """{fixture name: its imported LanguageModel}."""
  from configs import pretrained  # pylint: disable=g-import-not-at-top

  root, out = tmp_path_factory.mktemp("imported"), {}
  for name in ("llama_gqa", "mistral_window", "gemma3_text", "gpt2"):
    c = pretrained.get_config("import")
    c.pretrained.path = os.path.join(FIXTURES, name)
    memjax.run_mode("import", c, str(root / name))
    out[name] = memjax.load(str(root / name))
  return out


@pytest.mark.parametrize("name", ["llama_gqa", "mistral_window", "gemma3_text"])
def test_an_imported_model_decodes_as_it_scores(imported, name):
  lm = imported[name]
  rng = np.random.default_rng(1)
  v = lm.restored.vocab_size
  prompts = [rng.integers(0, v, n) for n in (7, 3)]
  forced = rng.integers(0, v, (2, 6))  # Past Mistral's window of 4.
  _check_forced(lm.restored.model, lm.restored.variables, prompts, forced)


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_greedy_gives_hugging_faces_continuation(imported, name):
  lm = imported[name]
  expected = np.load(os.path.join(FIXTURES, name, "expected.npz"))
  prompt, greedy = expected["greedy"][0][:5], expected["greedy"][0][5:]
  dec = lm_decoding.CachedDecoder(lm.restored.model)
  got = dec.generate(
      lm.restored.variables,
      [prompt],
      len(greedy),
      sampling_lib.Sampling(greedy=True),
      [0],
  )
  np.testing.assert_array_equal(got[0], greedy)


def test_a_batch_gives_each_prompt_what_it_gives_alone(imported):
  lm = imported["llama_gqa"]
  rng = np.random.default_rng(2)
  prompts = [rng.integers(0, lm.restored.vocab_size, n) for n in (2, 9, 5)]
  alone = [lm.generate(p, 7, greedy=True) for p in prompts]
  together = lm.generate(prompts, 7, greedy=True)
  for a, b in zip(alone, together):
    np.testing.assert_array_equal(a, b)
  # Sampled rows draw with seed + i, alone or in a batch.
  drawn = lm.generate(prompts, 5, top_k=5, seed=3)
  np.testing.assert_array_equal(
      drawn[1], lm.generate(prompts[1], 5, seed=4, top_k=5)
  )


def test_a_model_that_is_not_a_decoder_lm_is_named():
  assert "is not a decoder LM" in lm_decoding.unsupported(object())


@pytest.mark.parametrize("bos", [None, 5], ids=["no-bos", "bos"])
@pytest.mark.parametrize(
    "attention, options",
    [
        ("vanilla", {}),
        ("vanilla", {"sliding_window": 3}),
        ("rpe", {}),
        ("xl", {}),
        ("lamemo", {}),
    ],
    ids=["vanilla", "vanilla-rolling-window-3", "rpe", "xl", "lamemo"],
)
def test_models_without_memory_decode_in_evaluations_windows(
    attention, options, bos
):
  """Windows of T = 8 scoring S = 3: three prompts (3, 13 and 7 tokens,
  one longer than a window) and 20 forced tokens each, every step against
  evaluation's windows of the same text; with a sliding window of 3, its
  rolling cache through the prefill, the steps and the windows run
  again."""
  model = transformer.TransformerLM(
      cfg=helpers.tiny(
          32,
          num_layers=2,
          attention=attention,
          mem_len=0,
          attention_options=options,
      )
  )
  variables = helpers.random_params(model, np.zeros((1, 8), np.int32), None)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 32, n) for n in (3, 13, 7)]
  forced = rng.integers(0, 32, (3, 20))
  windows = decode_windows.Windows(8, 3, bos)
  dec = lm_decoding.decoder(model, windows=windows)
  got = dec.forced_log_probs(variables, prompts, forced)
  for b, prompt in enumerate(prompts):
    seq = np.concatenate([prompt, forced[b]])
    want = helpers.window_log_probs(model, variables, seq, 8, 3, bos)
    np.testing.assert_allclose(
        got[b, :-1], want[len(prompt) - 1 :], atol=1e-5, rtol=0
    )


@pytest.mark.parametrize(
    "attention, mem_len",
    [("xl", 4), ("xl", 9)],
    ids=["xl-memory-4", "xl-memory-9"],
)
def test_transformer_xl_decodes_as_recurrent_evaluation_predicts(
    attention, mem_len
):
  """Transformer-XL by segments of T = 6 with its memory of M (4 < T, and
  9 > T, reaching over two segments): two prompts of other lengths (one
  longer than a segment) in a batch, each step against the recurrent
  forward by segments, the memory carried."""
  model = transformer.TransformerLM(
      cfg=helpers.tiny(32, num_layers=2, attention=attention, mem_len=mem_len)
  )
  variables = helpers.random_params(model, np.zeros((1, 6), np.int32), None)
  rng = np.random.default_rng(3)
  prompts = [rng.integers(0, 32, 3), rng.integers(0, 32, 10)]
  forced = rng.integers(0, 32, (2, 14))
  dec = lm_decoding.decoder(model, segment_len=6)
  assert type(dec) is lm_decoding.CachedDecoder  # pylint: disable=unidiomatic-typecheck
  got = dec.forced_log_probs(variables, prompts, forced)
  for b, prompt in enumerate(prompts):
    seq = np.concatenate([prompt, forced[b]])
    want = helpers.recurrent_log_probs(model, variables, seq, 6)
    np.testing.assert_allclose(
        got[b], want[len(prompt) - 1 :], atol=1e-5, rtol=0
    )


def test_scanned_layers_decode_as_they_score():
  model = transformer.TransformerLM(
      cfg=helpers.tiny(32, num_layers=3, scan_layers=True)
  )
  variables = helpers.random_params(model, np.zeros((1, 8), np.int32), None)
  assert "layer_0_to_2" in variables["params"]
  rng = np.random.default_rng(4)
  prompts = [rng.integers(0, 32, n) for n in (4, 6)]
  _check_forced(model, variables, prompts, rng.integers(0, 32, (2, 5)))


def test_learned_positions_keep_a_long_prompts_last_tokens():
  model = transformer.TransformerLM(
      cfg=helpers.tiny(32, max_len=16), positions="learned"
  )
  variables = helpers.random_params(model, np.zeros((1, 8), np.int32), None)
  dec = lm_decoding.CachedDecoder(model)
  prompt = np.random.default_rng(5).integers(0, 32, 20)
  greedy = sampling_lib.Sampling(greedy=True)
  long = dec.generate(variables, [prompt], 4, greedy, [0])[0]
  cut = dec.generate(variables, [prompt[-13:]], 4, greedy, [0])[0]
  np.testing.assert_array_equal(long, cut)  # 13 + 4 - 1 = 16 positions.
  with pytest.raises(errors.ConfigError, match="max_len 16"):
    dec.generate(variables, [prompt], 17, greedy, [0])


def test_a_row_stops_at_any_eos_id_and_the_others_go_on(tmp_path):
  from configs import pretrained  # pylint: disable=g-import-not-at-top

  fixture = os.path.join(FIXTURES, "llama_bos")
  c = pretrained.get_config("import")
  c.pretrained.path = fixture
  memjax.run_mode("import", c, str(tmp_path / "bos"))
  lm = memjax.load(str(tmp_path / "bos"))
  assert lm.vocab.eos_ids == (2, 31)
  expected = np.load(os.path.join(fixture, "expected.npz"))
  prompt, greedy = expected["greedy"][0][:5], expected["greedy"][0][5:]
  other = expected["text_ids"][0][:3]
  got = lm.generate([prompt, other], 8, greedy=True)
  np.testing.assert_array_equal(got[0], greedy)  # Stopped by id 31.
  np.testing.assert_array_equal(got[1], lm.generate(other, 8, greedy=True))
  assert greedy[-1] == 31 and len(got[0]) == 3 and len(got[1]) == 8


def test_top_p_keeps_the_shortest_sorted_prefix_and_top_k_the_k_best():
  rng = np.random.default_rng(6)
  logits = 3.0 * rng.normal(size=(30, 40)).astype(np.float32)
  logits[:5, :20] = -np.inf  # Rows already cut (top-k first).
  for p in (0.3, 0.9, 0.999):
    got = np.isfinite(np.asarray(sampling_lib.top_p_filter(logits, p)))
    for row, keep in zip(logits, got):
      order = np.argsort(-row)
      probs = np.exp(row[order] - row.max())
      probs /= probs.sum()
      n = int(np.searchsorted(np.cumsum(probs), p)) + 1  # Mass >= p.
      assert set(np.flatnonzero(keep)) == set(order[:n])
  sampling = sampling_lib.Sampling(top_k=3)
  keys = jax.vmap(jax.random.PRNGKey)(np.arange(30))
  drawn = np.asarray(sampling.choose(jax.numpy.asarray(logits), keys))
  best = np.argsort(-logits, axis=1)[:, :3]
  assert all(d in b for d, b in zip(drawn, best))


@pytest.mark.parametrize("kind", ["pkm", "resm"])
def test_product_key_memories_decode_as_they_score(kind):
  model = transformer.TransformerLM(
      cfg=helpers.tiny(
          32,
          num_layers=2,
          feed_forward=kind,
          feed_forward_layers=(2,),
          feed_forward_options=dict(num_keys=4, heads=2, topk=2, k_dim=8),
      )
  )
  variables = helpers.random_params(model, np.zeros((1, 8), np.int32), None)
  rng = np.random.default_rng(7)
  prompts = [rng.integers(0, 32, n) for n in (3, 6)]
  _check_forced(model, variables, prompts, rng.integers(0, 32, (2, 4)))


def test_on_a_runs_mesh_the_cache_splits_rows_and_heads(tmp_path):
  """The import restored on 8 fake devices, data 4 x tensor 2: the
  cache's rows are split over 'data' (3 prompts padded to 4) and its
  key/value heads over 'tensor', and the log-probabilities and greedy
  tokens are those of the decoding off the mesh."""
  from configs import pretrained  # pylint: disable=g-import-not-at-top

  c = pretrained.get_config("import")
  c.pretrained.path = os.path.join(FIXTURES, "llama_gqa")
  memjax.run_mode("import", c, str(tmp_path / "llama"))
  lm = memjax.load(str(tmp_path / "llama"), mesh={"data": 4, "tensor": 2})
  r = lm.restored
  plain = lm_decoding.CachedDecoder(r.model)
  meshed = lm_decoding.CachedDecoder(r.model)
  meshed.prepare_run(r, r.variables)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, r.vocab_size, n) for n in (5, 9, 2)]
  forced = rng.integers(0, r.vocab_size, (3, 6))
  np.testing.assert_allclose(
      meshed.forced_log_probs(r.variables, prompts, forced),
      plain.forced_log_probs(r.variables, prompts, forced),
      atol=1e-5,
      rtol=0,
  )
  greedy = sampling_lib.Sampling(greedy=True)
  for a, b in zip(
      meshed.generate(r.variables, prompts, 8, greedy, [0, 1, 2]),
      plain.generate(r.variables, prompts, 8, greedy, [0, 1, 2]),
  ):
    np.testing.assert_array_equal(a, b)
  on_mesh, rows = decode_prompts.on_mesh(meshed.mesh, 3)
  assert rows == 4
  tokens, positions, _, valid, _ = meshed._prepare(prompts + prompts[:1], 4)  # pylint: disable=protected-access
  with on_mesh:
    _, cache, _ = meshed.prefill(
        r.variables, tokens, positions, valid, valid.shape[1]
    )
  keys = cache[0][0]
  assert keys.shape[2] % 2 == 0
  assert tuple(keys.sharding.spec)[:3] == ("data", None, "tensor")
