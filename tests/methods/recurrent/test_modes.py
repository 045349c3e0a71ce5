"""Recurrent evaluation, extrapolation, sampling, and the txl / lamemo
configs end to end (training; on LaMemo also the extrapolate, analyze and
generate modes)."""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lamemo_wt103
from configs import txl_wt103
import memjax
from memjax import build
from memjax import config as config_lib
from memjax.data import corpus as corpus_lib
from memjax.eval import rows as rows_lib
from memjax.eval import scorer as scorer_lib
from memjax.models import lm_decoding
from memjax.models import sampling as sampling_lib
from memjax.eval import streams as recurrent_eval
from memjax import sharding as sharding_lib
from memjax.methods.recurrent import analysis
from memjax.methods.recurrent import config as recurrent_config
from memjax.methods.recurrent import extrapolate
from memjax.data import windows
from memjax.models import transformer
from tests.models import helpers
from tests import shared_runs
from tests.conftest import run_main

V, T = 64, 4


@functools.lru_cache(maxsize=None)
def tiny(kind="lamemo", mem_len=T):
  model = transformer.TransformerLM(
      cfg=helpers.tiny(
          V,
          num_layers=2,
          cutoffs=(16, 40),
          mem_len=mem_len,
          attention=kind,
      )
  )
  x = jnp.zeros((1, T), jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), x, x)["params"]
  return model, params


def stream_tokens(n, seed=0):
  return np.random.default_rng(seed).integers(0, V, n).astype(np.int32)


def loop_scores(model, params, tokens, lanes):
  """Per-segment, per-lane NLL sums and the target log-probs, by a Python
  loop over the segments with the memory carried."""
  step = jax.jit(
      lambda m, x, y: model.apply({"params": params}, x, y, memory=m)
  )
  memory = model.init_memory(lanes)
  nll, logps = [], []
  for seg in windows.SegmentStream(tokens, T, lanes):
    out = step(memory, seg["inputs"], seg["targets"])
    memory = out.memory
    lp = np.asarray(out.target_logprob)
    nll.append(-(lp * seg["weights"]).sum(axis=1))
    logps.append(lp)
  return np.stack(nll), np.stack(logps)


def test_stream_evaluation_equals_python_loop_over_segments():
  """Chunked scan, lanes padded to the 8 devices, a partial last segment."""
  model, params = tiny()
  tokens = stream_tokens(50)
  lanes = 3
  mesh = sharding_lib.make_mesh({"data": -1})
  ev = recurrent_eval.StreamScorer(
      rows_lib.Scoring(model=model, mesh=mesh),
      segment_len=T,
      mem_len=model.cfg.mem_len,
      lanes=lanes,
      chunk=2,
  )
  assert ev.padded_lanes == 8
  segments = recurrent_eval.stacked_segments(tokens, T, lanes)
  got = ev.score_segments(params, segments)
  want, _ = loop_scores(model, params, tokens, lanes)
  assert got["nll_sum"].shape == want.shape == (5, 3)
  np.testing.assert_allclose(got["nll_sum"], want, rtol=1e-5, atol=1e-5)
  res = ev.score(params, tokens)
  assert res["tokens"] == len(tokens) - 1
  assert res["nll"] == pytest.approx(want.sum() / (len(tokens) - 1), rel=1e-5)
  assert res["ppl"] == pytest.approx(np.exp(res["nll"]))


def test_extrapolation_with_m1_equals_recurrent_evaluation(tmp_path):
  model, params = tiny()
  config = config_lib.base_config()
  config.data.seq_len = T
  config.model.mem_len = T
  config.extrapolate.ratios = (1, 3)
  mesh = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  run = build.build(config, str(tmp_path), mesh={"data": 1})
  scoring = run.scoring(model, mesh=mesh, unit="ppl")
  assert scoring.window_bos is None  # memjax's own vocabulary: no BOS.
  tokens = stream_tokens(60, seed=1)
  rows = extrapolate.extrapolation_rows(
      scoring, run.settings.of(recurrent_config.Extrapolate), params, tokens
  )
  plain = scorer_lib.scorer_for(scoring).score(params, tokens)
  assert [r["mem_len"] for r in rows] == [T, 3 * T]
  assert rows[0]["nll"] == pytest.approx(plain["nll"], rel=1e-6)
  assert rows[0]["tokens"] == plain["tokens"] == 59
  assert abs(rows[1]["nll"] - plain["nll"]) > 1e-5  # a longer memory


def test_top_p_keeps_the_smallest_set_reaching_p():
  probs = np.array([0.05, 0.5, 0.15, 0.3])
  logits = jnp.log(jnp.asarray(probs, jnp.float32))
  kept = lambda p: set(
      np.flatnonzero(
          np.isfinite(np.asarray(sampling_lib.top_p_filter(logits, p)))
      )
  )
  assert kept(0.45) == {1}
  assert kept(0.75) == {1, 3}
  assert kept(0.9) == {1, 3, 2}
  assert kept(0.99) == kept(1.0) == {0, 1, 2, 3}
  # Kept logits are unchanged.
  filtered = np.asarray(sampling_lib.top_p_filter(logits, 0.75))
  np.testing.assert_array_equal(filtered[[1, 3]], np.asarray(logits)[[1, 3]])
  # Random distributions, batched: the kept set is the most likely tokens,
  # its mass reaches p, and it would not without its least likely member.
  rng = np.random.default_rng(0)
  logits = 2.0 * rng.normal(size=(20, 50)).astype(np.float32)
  p = 0.95
  keep = np.isfinite(np.asarray(sampling_lib.top_p_filter(logits, p)))
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  for row, k in zip(probs, keep):
    assert row[k].min() >= row[~k].max(initial=0.0)
    assert row[k].sum() >= p - 1e-6
    assert row[k].sum() - row[k].min() < p
  with pytest.raises(ValueError, match="top_p"):
    sampling_lib.top_p_filter(logits, 0.0)


def test_generation_is_deterministic_and_predicts_like_evaluation():
  model, params = tiny()
  dec = lm_decoding.decoder(model, segment_len=T)
  prompt = [stream_tokens(7, seed=2)]
  top_p = sampling_lib.Sampling(top_p=0.95)
  a = dec.generate(params, prompt, 9, top_p, [3])[0]
  b = dec.generate(params, prompt, 9, top_p, [3])[0]
  c = dec.generate(params, prompt, 9, top_p, [4])[0]
  assert a.shape == (9,) and a.dtype == np.int32
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()
  # The decoder's segments give the log-probabilities of a recurrent
  # evaluation of the same stream (its Python loop over segments).
  tokens = stream_tokens(3 * T + 2, seed=5)
  got = dec.forced_log_probs(params, [tokens[:1]], tokens[None, 1:])[0]
  got = got[np.arange(len(tokens) - 1), tokens[1:]]
  _, logps = loop_scores(model, params, tokens, 1)
  want = logps[:, 0].reshape(-1)[: len(tokens) - 1]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_by_distance_counts_each_key_once():
  # 1 lane, 1 head, T = 2 queries, M = 2 memory slots (slot 0 invalid).
  probs = jnp.asarray(
      [[[[0.0, 0.2, 0.8, 0.0], [0.0, 0.1, 0.3, 0.6]]]], jnp.float32
  )
  key_valid = jnp.asarray([[False, True, True, True]])
  sums, counts = analysis.attention_by_distance(
      probs, key_valid, jnp.ones((1, 2)), mem_len=2
  )
  # Distance d: query 0 (row 2) reads key 2 - d, query 1 (row 3) 3 - d.
  np.testing.assert_allclose(
      np.asarray(sums), [0.8 + 0.6, 0.2 + 0.3, 0.0 + 0.1, 0.0]
  )
  np.testing.assert_allclose(np.asarray(counts), [2, 2, 1, 0])


def test_memory_models_need_consecutive_batches_of_whole_lanes(tmp_path):
  mesh = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])

  def check_batch_fits(config):
    run = build.build(config, str(tmp_path), mesh={"data": 1})
    run.task.check_batch_fits(mesh, run.carries_memory())

  config = lamemo_wt103.get_config("smoke")
  config.data.batching = "random"
  with pytest.raises(ValueError, match="consecutive"):
    check_batch_fits(config)
  config = lamemo_wt103.get_config("smoke")
  config.data.segments_per_lane = 4  # 2 lanes
  config.train.grad_accum = 4
  with pytest.raises(ValueError, match="whole lanes"):
    check_batch_fits(config)
  check_batch_fits(txl_wt103.get_config("rpe_smoke"))


def test_config_variants(tmp_path):
  base = lamemo_wt103.get_config("base")
  assert (
      base.model.num_layers,
      base.model.num_heads,
      base.model.head_dim,
      base.model.d_model,
      base.model.d_ff,
  ) == (16, 10, 41, 410, 2100)
  assert tuple(base.model.cutoffs) == (20000, 40000, 200000)
  assert base.data.seq_len == base.model.mem_len == 150
  assert base.data.batch_size == 64 and base.train.num_steps == 250000
  assert base.optim.learning_rate == 2.5e-4 and base.optim.clip_norm == 0.25
  assert base.model.attention_options.position == "disentangled"
  e8 = txl_wt103.get_config("txl_enwik8")
  assert e8.data.corpus == "enwik8" and e8.model.attention == "xl"
  assert (
      e8.model.num_layers,
      e8.model.num_heads,
      e8.model.head_dim,
      e8.model.d_ff,
      e8.data.seq_len,
      e8.model.mem_len,
  ) == (12, 8, 64, 2048, 512, 512)
  assert txl_wt103.get_config("rpe_base").model.mem_len == 0
  assert not lamemo_wt103.get_config(
      "no_interp_demo"
  ).model.attention_options.interpolate
  assert not lamemo_wt103.get_config(
      "no_lookahead_demo"
  ).model.attention_options.look_ahead
  assert (
      lamemo_wt103.get_config("xl_pos_demo").model.attention_options.position
      == "xl"
  )
  tl = lamemo_wt103.get_config("trime_long_base")
  assert (tl.loss.name, tl.trime.memory) == ("trime", "long")
  assert tl.data.segments_per_lane > 1 and tl.model.attention == "lamemo"
  demo = [
      txl_wt103.get_config("rpe_demo"),
      txl_wt103.get_config("demo"),
      lamemo_wt103.get_config("demo"),
  ]
  assert len({c.train.num_steps for c in demo}) == 1
  # The GPU-sized character-level comparison: segment = memory >= 256 bytes
  # for both memory models, the same steps and data for all three rows.
  gpu = [
      txl_wt103.get_config("rpe_char_gpu"),
      txl_wt103.get_config("char_gpu"),
      lamemo_wt103.get_config("char_gpu"),
  ]
  for c in gpu:
    build.build(c, str(tmp_path))
    assert c.data.corpus == "enwik8" and c.data.seq_len >= 256
    assert tuple(c.model.cutoffs) == ()
  assert gpu[0].model.mem_len == 0
  assert gpu[1].model.mem_len == gpu[2].model.mem_len == gpu[1].data.seq_len
  assert len({(c.train.num_steps, c.data.batch_size) for c in gpu}) == 1


def _check_saved_results(workdir, steps):
  """results.json: ``steps`` steps, each split scored in lanes; returns it."""
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["step"] == steps
  for split in ("valid", "test"):
    assert np.isfinite(saved[split]["ppl"])
    # Recurrent evaluation: 4 segments of 16 in each of 2 lanes.
    assert saved[split]["tokens"] == 4 * 16 * 2
  return saved


def _check_results(results, workdir, steps):
  """What training returned is what it saved."""
  saved = _check_saved_results(workdir, steps)
  assert results["valid"]["nll"] == pytest.approx(saved["valid"]["nll"])


def test_txl_smoke_config_trains_end_to_end(tmp_path):
  config = shared_runs.recurrent_smoke_config(
      "txl_wt103", str(tmp_path / "cache")
  )
  workdir = str(tmp_path / "run")
  results = memjax.train(config, workdir)
  _check_results(results, workdir, steps=6)
  # python -m memjax.main --mode=generate decodes Transformer-XL with a
  # key/value cache, its memory read as recurrent evaluation carries it:
  # each greedy token is the argmax of evaluation's prediction.
  proc = run_main(
      *shared_runs.recurrent_smoke_flags("txl_wt103", str(tmp_path / "cache")),
      f"--workdir={workdir}",
      "--config.generate.num_tokens=24",
      "--config.generate.prompt_len=20",
      "--config.generate.greedy=True",
      "--mode=generate",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "decoding with a key/value cache" in proc.stdout + proc.stderr
  with open(os.path.join(workdir, "generation.json")) as f:
    res = json.load(f)
  lm = memjax.load(workdir)
  model = lm.restored.model
  assert lm_decoding.unsupported(model) is None and model.carries_memory()
  seg = int(lm.settings.eval.segment_len or lm.settings.data.seq_len)
  seq = np.asarray(res["prompt_ids"] + res["ids"], np.int32)
  lp = helpers.recurrent_log_probs(model, lm.restored.variables, seq, seg)
  assert res["ids"] == lp[19:-1].argmax(-1).tolist() and seg < 20 + 24


def test_a_translation_model_with_relative_positions_decodes(tmp_path):
  """The encoder-decoder with 'rpe' attention, trained through python -m
  memjax.main: its evaluation translates valid sentences, its decoder
  stepping through the relative attention's cached ``decode_step``."""
  proc = run_main(
      "--config=configs/trime_iwslt.py:smoke",
      "--config.model.attention=rpe",
      f"--workdir={tmp_path / 'run'}",
      "--config.train.num_steps=4",
      "--config.translation.eval_max_sentences=8",
      "--config.translation.buckets=(32,)",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "run" / "config.json") as f:
    assert json.load(f)["model"]["attention"] == "rpe"
  assert "decoding: 8/8 sentences" in proc.stdout + proc.stderr
  assert "valid: BLEU" in proc.stdout


def test_lamemo_smoke_run_and_its_modes(lamemo_smoke_workdir, tmp_path):
  """The shared LaMemo smoke run (6 steps), then its modes on a copy."""
  _check_saved_results(lamemo_smoke_workdir, steps=6)
  assert "valid: ppl" in shared_runs.shared_stdout(lamemo_smoke_workdir)
  workdir = str(tmp_path / "run")
  shutil.copytree(lamemo_smoke_workdir, workdir)
  config = shared_runs.recurrent_smoke_config(
      "lamemo_wt103", shared_runs.lamemo_smoke_cache(lamemo_smoke_workdir)
  )

  # The Python API scores as --mode=eval does, memory carried in lanes.
  model = memjax.load(workdir)
  run = build.build(config, workdir)
  stream = corpus_lib.load_corpus(
      run.settings.data, run.settings.eval, workdir, ("valid",), train=False
  )
  tokens = stream.splits["valid"].tokens[:300]
  ev = scorer_lib.scorer_for(model.restored.scoring())
  want = ev.score(model.restored.params, tokens, 0, "valid prefix")
  got = model.score(tokens)
  assert got["tokens"] == want["tokens"] == 299
  assert got["nll"] == pytest.approx(want["nll"], rel=1e-5)
  assert len(got["logprobs"][0]) == 299

  config.extrapolate.ratios = (1, 2)
  config.extrapolate.max_segments = 3
  res = memjax.run_mode("extrapolate", config, workdir)
  assert [r["m"] for r in res["rows"]] == [1, 2]
  config.analyze.num_segments = 3
  res = memjax.run_mode("analyze", config, workdir)
  dist = np.load(os.path.join(workdir, "attention_by_distance.npy"))
  assert dist.shape == (2, 32)
  alpha = np.load(os.path.join(workdir, "alpha.npy"))
  assert alpha.shape == (2, 16)
  assert ((alpha >= 0) & (alpha <= 1)).all()
  # The same run restored with its layers scanned: the per-layer sows of
  # the scanned blocks are read layer by layer, to the same figures.
  config.model.scan_layers = True
  memjax.run_mode("analyze", config, workdir)
  config.model.scan_layers = False
  for name, want in (("attention_by_distance.npy", dist), ("alpha.npy", alpha)):
    np.testing.assert_allclose(
        np.load(os.path.join(workdir, name)), want, rtol=1e-5, atol=1e-7
    )
  # Generation: the key/value cache, the memory refreshed by look-ahead
  # as recurrent evaluation refreshes it (greedy: its argmax).
  config.generate.num_tokens = 5
  config.generate.prompt_len = 20
  config.generate.greedy = True
  res = memjax.run_mode("generate", config, workdir)
  assert len(res["ids"]) == 5
  seq = np.asarray(res["prompt_ids"] + res["ids"], np.int32)
  seg = int(config.eval.segment_len or config.data.seq_len)
  lm = memjax.load(workdir)
  lp = helpers.recurrent_log_probs(
      lm.restored.model, lm.restored.variables, seq, seg
  )
  assert res["ids"] == lp[19:-1].argmax(-1).tolist() and seg < 25
  for name in (
      "extrapolation.csv",
      "extrapolation.png",
      "attention_by_distance.png",
      "generation.txt",
  ):
    assert os.path.isfile(os.path.join(workdir, name)), name
