"""Evaluation memories read while generating (memjax.memory.generation):
the per-token sums against a NumPy loop, and, on the shared smoke run, each
step's distribution against what scoring (the --mode=memeval path) gives
the same prefix."""

import dataclasses
import json
import shutil

import numpy as np
import pytest

import memjax
from memjax import errors
from memjax import settings as settings_lib
from memjax.memory import generation
from memjax.methods.cache import continuous_cache
from memjax.methods.external import memories as external
from memjax.methods.trime import in_batch
from memjax.models import lm_decoding
from memjax.modes import generate as generate_lib
from tests.conftest import run_main

TRIME = {"kind": "trime", "temperature": 1.0}
CACHE = {"kind": "cache", "cache_theta": 0.5, "cache_lambda": 0.3}
# At least 32 tokens: the smoke run's whole first window (eval.window_len
# 32, its second half scored in a second copy, eval.score_len 16).
TEXT = (
    "the cat sat on the mat and the dog sat on the mat and the cat ran to "
    "the house of the man who sat on a big red mat in the house"
)


def test_token_logsumexp_is_a_log_sum_exp_per_token():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(3, 7)).astype(np.float32) * 30
  tokens = rng.integers(0, 5, (3, 7))
  valid = rng.random((3, 7)) < 0.7
  got = np.asarray(generation.token_logsumexp(scores, tokens, valid, 6))
  for b in range(3):
    for w in range(6):
      s = scores[b][valid[b] & (tokens[b] == w)].astype(np.float64)
      want = np.log(np.exp(s - s.max()).sum()) + s.max() if len(s) else -np.inf
      np.testing.assert_allclose(got[b, w], want, rtol=1e-6, atol=1e-5)


def test_a_distribution_with_memory_sums_to_one_and_reads_only_visible():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(2, 9)).astype(np.float32)
  log_z = np.log(np.exp(logits).sum(-1))
  logp = logits - log_z[:, None]
  keys = rng.normal(size=(2, 5, 4)).astype(np.float32)
  tokens = rng.integers(0, 9, (2, 5))
  visible = np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], bool)
  reader = generation.MemoryReader(
      "trime", in_batch.TrimeMemory(), (("temperatures", (1.0,)),), 32, 16
  )
  sim = np.einsum("bd,bld->bl", keys[:, 0], keys)
  out = np.asarray(
      reader.log_probs(logp, log_z, keys[:, 0], sim, tokens, visible)
  )
  np.testing.assert_allclose(np.exp(out).sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(out[1], logp[1], atol=1e-6)  # Nothing visible.
  # Eq. 6 by hand for row 0: exp(logits) and exp(sim / sqrt(d)) share one
  # normaliser.
  sim = keys[0, :3] @ keys[0, 0] / 2.0
  mass = np.exp(logits[0]).astype(np.float64)
  np.add.at(mass, tokens[0, :3], np.exp(sim))
  np.testing.assert_allclose(out[0], np.log(mass / mass.sum()), atol=1e-5)


@pytest.mark.parametrize(
    "memory, settings, needle",
    [
        (
            external.KnnMemory(),
            (("knn_temperatures", (1.0,)), ("knn_lambdas", (0.5,))),
            "external datastore",
        ),
        (
            continuous_cache.CacheMemory(),
            (("thetas", (0.1, 0.2)), ("lambdas", (0.1,))),
            "one value of thetas",
        ),
    ],
)
def test_memories_generation_cannot_read_are_named(memory, settings, needle):
  with pytest.raises(errors.ConfigError, match=needle):
    generation.MemoryReader("x", memory, settings, 32, 16)


@pytest.fixture(scope="module")
def model(smoke_workdir):
  return memjax.load(smoke_workdir)


def _forced(model, setting, prompts, forced):
  reader = generate_lib.memory_reader(model.restored.scoring(), setting)
  dec = lm_decoding.CachedDecoder(model.restored.model, reader)
  return dec.forced_log_probs(model.restored.variables, prompts, forced)


def _with_span(workdir, span):
  """The run loaded with ``eval_memory.long_mem_span`` = ``span``."""
  lm = memjax.load(workdir)
  s = lm.settings.replace(
      settings_lib.replaced(lm.settings.eval_memory, long_mem_span=span)
  )
  run = lm.restored.run.replace(*s.sections.values())
  lm.restored, lm.settings = dataclasses.replace(lm.restored, run=run), s
  return lm


@pytest.mark.parametrize(
    "setting, span, windows",
    [
        (TRIME, "before_window", 1),
        (CACHE, "before_window", 1),
        ({**TRIME, "long_mem_tokens": 16}, "before_window", 3),
        ({**CACHE, "long_mem_tokens": 24}, "last_scored", 3),
    ],
    ids=["trime", "cache", "trime-long", "cache-long-last-scored"],
)
def test_each_step_reads_the_memory_as_scoring_does(
    smoke_workdir, setting, span, windows
):
  """The smoke run's windows: T = 32 predictions, the first window's second
  half scored in a copy, then windows of S = 16; M_long of N pairs. The
  3-token prompt's stream makes ``windows`` windows; past the first, the
  other prompt is longer than a window (40 tokens)."""
  lm = _with_span(smoke_workdir, span)
  size = (
      lm.settings.eval.window_len + (windows - 1) * lm.settings.eval.score_len
  )
  tokens = lm.encode(TEXT * (windows + 1))
  first = 40 if windows > 1 else 6
  n = size + 1 - (3 if windows > 1 else first)
  assert len(tokens) >= first + n
  prompts = [tokens[:first], tokens[:3]]
  forced = np.stack([tokens[first : first + n], tokens[3 : 3 + n]])
  got = _forced(lm, setting, prompts, forced)
  lm.memory = setting
  for b, prompt in enumerate(prompts):
    seq = np.concatenate([prompt, forced[b]])
    want = lm.score(seq)["logprobs"][0][len(prompt) - 1 :]
    picked = got[b, np.arange(n), forced[b]]
    np.testing.assert_allclose(picked, want, atol=1e-5, rtol=0)
    plain = lm.score(seq, memory=False)["logprobs"][0][len(prompt) - 1 :]
    assert np.abs(plain - want).max() > 0.1  # The memory counts.
    if setting.get("long_mem_tokens"):  # And M_long, past the first window.
      lm.memory = {**setting, "long_mem_tokens": 0}
      local = lm.score(seq)["logprobs"][0][len(prompt) - 1 :]
      lm.memory = setting
      assert np.abs(local - want).max() > 1e-3
  np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-4)


def test_greedy_generation_with_memory_runs_on_through_the_windows(model):
  """40 new tokens after 6: the windows slide at predictions 32 and 48."""
  setting = {**CACHE, "long_mem_tokens": 16}
  prompt = model.encode(TEXT)[:6]
  new = model.generate(prompt, 40, greedy=True, memory=setting)
  assert len(new) == 40
  got = _forced(model, setting, [prompt], new[None, :-1])[0]
  np.testing.assert_array_equal(got.argmax(-1), new)


def test_a_batch_with_memory_gives_each_prompt_what_it_gives_alone(model):
  """Sampled with top-p, a prompt longer than the first window among
  them: each row draws with its own seed and slides on its own steps."""
  setting = {**TRIME, "long_mem_tokens": 16}
  tokens = model.encode(TEXT * 2)
  prompts = [tokens[:5], tokens[:40], tokens[:17]]
  together = model.generate(prompts, 24, top_p=0.9, seed=5, memory=setting)
  for i, prompt in enumerate(prompts):
    alone = model.generate(prompt, 24, top_p=0.9, seed=5 + i, memory=setting)
    np.testing.assert_array_equal(together[i], alone)


def test_memory_true_needs_a_run_with_a_memory(model):
  bare = memjax.load(model.restored.path)
  bare.memory = {"kind": "none"}
  with pytest.raises(ValueError, match="no evaluation memory"):
    bare.generate([1, 2, 3], 2, memory=True)


KNN = {"kind": "knn", "knn_temperature": 1.0, "knn_lambda": 0.5}
EXTERNAL = {
    "knn": (KNN, 2e-5),
    "trime_ext": (
        {
            "kind": "trime_ext",
            "temperature": 1.0,
            "ext_temperature": 1.0,
            "ext_lambda": 0.3,
            "ext_interp_local": 0,
        },
        1e-5,
    ),
    "knn_cache": (
        {**KNN, **CACHE, "kind": "knn_cache"},
        2e-5,
    ),
}


@pytest.fixture(scope="module")
def datastore(smoke_workdir, tmp_path_factory):
  """A datastore of the smoke run's features (20 windows of train)."""
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax.methods.external import modes as external_modes  # pylint: disable=g-import-not-at-top

  c = trime_wt103.get_config("smoke")
  c.train.init_from = smoke_workdir
  c.datastore.max_windows = 20
  c.datastore.shard_keys = 256
  c.eval_memory.kind = "knn"
  run = build.build(c, str(tmp_path_factory.mktemp("ext") / "run"))
  return external_modes.datastore(run)["path"]


@pytest.mark.parametrize("kind", sorted(EXTERNAL))
def test_each_step_reads_a_datastore_as_scoring_does(model, datastore, kind):
  setting, atol = EXTERNAL[kind]
  lm = memjax.load(model.restored.path)
  lm.attach(datastore, setting, search="exact", ext_k=8)
  tokens = lm.encode(TEXT)[: lm.settings.eval.window_len]
  prompts, n = [tokens[:5], tokens[:2]], len(tokens) - 5
  forced = np.stack([tokens[5:], np.resize(tokens[2:], n)])
  got = _forced(lm, lm.memory, prompts, forced)
  for b, prompt in enumerate(prompts):
    seq = np.concatenate([prompt, forced[b]])
    want = lm.score(seq)["logprobs"][0][len(prompt) - 1 :]
    picked = got[b, np.arange(n), forced[b]]
    np.testing.assert_allclose(picked, want, atol=atol, rtol=0)
    plain = lm.score(seq, memory=False)["logprobs"][0][len(prompt) - 1 :]
    assert np.abs(plain - want).max() > 0.1  # The memory counts.
  np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-4)
  new = lm.generate(prompts[0], 4, greedy=True, memory=True)
  steps = _forced(lm, lm.memory, [prompts[0]], new[None, :-1])[0]
  np.testing.assert_array_equal(steps.argmax(-1), new)


def lm_window(workdir):
  return memjax.load(str(workdir)).settings.eval.window_len


def test_generate_mode_reads_the_runs_memory(smoke_workdir, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(smoke_workdir, workdir)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text(f"the cat sat on the\n{TEXT}\n")  # TEXT: > 1 window
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      f"--config.generate.prompts={prompts}",
      "--config.generate.num_tokens=6",
      "--config.generate.greedy=True",
      "--config.generate.memory=True",
      "--mode=generate",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "and the cache memory" in proc.stdout + proc.stderr
  rows = [
      json.loads(line)
      for line in (workdir / "generations.jsonl").read_text().splitlines()
  ]
  assert len(rows[1]["prompt_ids"]) > lm_window(workdir)
  lm = memjax.load(str(workdir))
  for row in rows:
    assert row["ids"] == list(
        lm.generate(row["prompt_ids"], 6, greedy=True, memory=True)
    )
