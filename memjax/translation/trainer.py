"""Training and scoring a translation run (``--mode=train`` of a translation
config goes here through ``memjax.modes.translation``).

The set-up is translation's own (parallel splits, the joint sentencepiece
vocabulary, token batches, BLEU instead of perplexity); the parts are the
experiment layer's (``build_model``, ``make_optimizer``, ``create_state``),
the step is ``train_step.make_train_step`` (the model's ``EXTRA_INPUTS``
carry the source), checkpoints and resuming are ``checkpointing``'s.
Everything the user can get wrong (data files, a vocabulary of another run,
a checkpoint of another model) is checked before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from memjax import checkpointing
from memjax import console
from memjax import errors
from memjax import experiment
from memjax import losses
from memjax import registry
from memjax import runfiles
from memjax import sharding as sharding_lib
from memjax import train_step as train_step_lib
from memjax.data import parallel
from memjax.translation import bleu
from memjax.translation import translator as translator_lib


def data_dir(config: ml_collections.ConfigDict) -> str:
  return config.data.data_dir or parallel.DEFAULT_DIR


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for settings a translation run cannot use."""
  if config.model.family != "encoder_decoder":
    raise errors.ConfigError(
        "a translation run needs model.family='encoder_decoder', got "
        f"{config.model.family!r}"
    )
  registry.OBJECTIVES.get(config.loss.name)
  registry.BATCHERS.get(config.data.batching)
  t = config.translation
  if t.source_lang == t.target_lang:
    raise errors.ConfigError(
        "translation.source_lang and target_lang must differ, both are "
        f"{t.source_lang!r}"
    )
  if t.beam_size < 1 or t.decode_batch_size < 1:
    raise errors.ConfigError(
        "translation.beam_size and decode_batch_size must be >= 1"
    )
  if max(t.buckets) > config.model.max_len:
    raise errors.ConfigError(
        f"translation.buckets {tuple(t.buckets)} exceed model.max_len "
        f"{config.model.max_len}"
    )


def check_vocabulary(vocab_path: str, workdir: str) -> None:
  """Raises CheckpointMismatchError if ``workdir`` holds a run trained with
  another vocabulary than ``vocab_path``."""
  saved = os.path.join(workdir, runfiles.VOCAB_FILE)
  if not os.path.isfile(saved):
    return
  with open(saved) as f:
    info = json.load(f)
  sha = runfiles.file_sha1(vocab_path)
  if info.get("kind") != "sentencepiece" or info.get("sha1") != sha:
    raise errors.CheckpointMismatchError(
        f"{vocab_path} is not the vocabulary the run in {workdir} was trained "
        f"with (sha1 {sha[:12]} vs {str(info.get('sha1'))[:12]}): use the "
        "run's spm.model or another --workdir"
    )


def vocabulary_path(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The sentencepiece model of a run: ``translation.vocab_file``, the one a
  run in ``workdir`` saved, or one trained on the training split."""
  t = config.translation
  if t.vocab_file:
    path = os.path.abspath(t.vocab_file)
    parallel.load_vocabulary(path)
    check_vocabulary(path, workdir)
    return path
  saved = os.path.join(workdir, runfiles.SPM_FILE)
  if os.path.isfile(saved):
    return saved
  return parallel.train_vocabulary(
      data_dir(config), t.source_lang, t.target_lang, int(t.vocab_size),
      os.path.join(workdir, "cache"),
  )  # fmt: skip


def read_split(config, split: str, vocab_path: str, workdir: str):
  t = config.translation
  return parallel.encode_split(
      data_dir(config), split, t.source_lang, t.target_lang, vocab_path,
      os.path.join(workdir, "cache"),
  )  # fmt: skip


def make_translator(config, model, params, vocab, hook=None):
  t = config.translation
  return translator_lib.Translator(
      model, params, vocab, beam_size=t.beam_size,
      length_penalty=t.length_penalty, max_len_a=t.max_len_a,
      max_len_b=t.max_len_b, batch_size=t.decode_batch_size, hook=hook,
  )  # fmt: skip


def score_split(tr, split_data, max_sentences: int, desc: str) -> dict:
  """Translates a split (beam) and scores it with sacreBLEU."""
  n = len(split_data.source)
  if max_sentences:
    n = min(n, int(max_sentences))
  start = time.time()
  ids = tr.translate_ids(split_data.source[:n], desc=desc)
  hyps = [tr.vocab.decode(x) for x in ids]
  scores = bleu.score(hyps, split_data.target_text[:n])
  scores["decode_seconds"] = time.time() - start
  scores["hypotheses"] = hyps
  return scores


@dataclasses.dataclass
class _Run:
  config: Any
  mesh: Any
  vocab_path: str
  model: Any
  batcher: Any
  tx: Any
  schedule: Any
  loss_fn: Any
  state: Any
  shardings: Any
  ckpt: Any
  start: int


def _prepare(config, workdir: str) -> _Run:
  check_config(config)
  t = config.translation
  parallel.split_files(data_dir(config), "train", t.source_lang, t.target_lang)
  for s in t.eval_splits:
    parallel.split_files(data_dir(config), s, t.source_lang, t.target_lang)
  mesh = experiment.make_mesh(config)
  with experiment.cleanup_on_error(workdir):
    vocab_path = vocabulary_path(config, workdir)
    vocab = parallel.load_vocabulary(vocab_path)
    train = read_split(config, "train", vocab_path, workdir)
    for s in t.eval_splits:
      read_split(config, s, vocab_path, workdir)  # Bad files fail here.
    batcher = registry.BATCHERS.get(config.data.batching)(config, train, "")
    console.info(
        "parallel text %s-%s: %d training pairs (%d longer than %d left out),"
        " vocabulary %d, %d batches per epoch", t.source_lang, t.target_lang,
        len(train.source), batcher.dropped, max(t.buckets), vocab.vocab_size,
        batcher.num_batches,
    )  # fmt: skip
    model = experiment.build_model(config.model, int(vocab.vocab_size))
    num_steps = int(config.train.num_steps)
    tx, schedule = experiment.make_optimizer(config, num_steps)
    loss_fn = losses.make_loss(config.loss, num_steps, seed=config.seed)
    state, shardings = experiment.create_state(
        model, tx, mesh, batcher.batch(0), jax.random.PRNGKey(config.seed)
    )
    signature = experiment.model_signature(config, int(vocab.vocab_size))
    ckpt = checkpointing.Checkpointer(
        os.path.join(workdir, "checkpoints"),
        keep=config.train.keep_checkpoints, signature=signature,
    )  # fmt: skip
  abstract = checkpointing.abstract_with_sharding(state, shardings)
  restored = ckpt.restore_latest(abstract)
  start = 0
  if restored is not None:
    state, _, start = restored
    console.info("resumed from %s at step %d", ckpt.directory, start)
  runfiles.write_run_files(workdir, config, vocab)
  return _Run(
      config, mesh, vocab_path, model, batcher, tx, schedule, loss_fn, state,
      shardings, ckpt, int(start),
  )  # fmt: skip


def _loop(r: _Run, workdir: str) -> float:
  """Runs the updates; returns the seconds they took."""
  c = r.config
  num_steps = int(c.train.num_steps)
  step_fn = train_step_lib.make_train_step(
      r.model, r.tx, r.loss_fn, grad_accum=c.train.grad_accum,
      state_shardings=r.shardings, mesh=r.mesh,
  )  # fmt: skip
  rng = jax.random.PRNGKey(c.seed + 1)
  start, pending = time.time(), []
  state = r.state
  log_path = os.path.join(workdir, "train_log.jsonl")
  for step in range(r.start, num_steps):
    batch = sharding_lib.put_global_batch(r.batcher.batch(step), r.mesh)
    state, metrics = step_fn(state, batch, rng)
    pending.append((step, metrics))
    done = step + 1
    if done % c.train.log_every == 0 or done == num_steps:
      fetched = jax.device_get([m for _, m in pending])
      with open(log_path, "a") as f:
        for (s, _), m in zip(pending, fetched):
          if not m["finite"]:
            raise errors.NonFiniteLossError(
                f"non-finite loss at step {s + 1}: lower "
                "optim.learning_rate or set optim.clip_norm"
            )
          tokens = max(float(m["tokens"]), 1.0)
          f.write(json.dumps({
              "step": s + 1, "loss": float(m["loss"]),
              "nll": float(m.get("aux_nll_sum", m["nll_sum"])) / tokens,
          }) + "\n")  # fmt: skip
      last = fetched[-1]
      tokens = max(float(last["tokens"]), 1.0)
      console.info(
          "step %d/%d  loss %.3f  nll %.3f  lr %.2e  %.1f s",
          done, num_steps, float(last["loss"]),
          float(last.get("aux_nll_sum", last["nll_sum"])) / tokens,
          float(r.schedule(done - 1)), time.time() - start,
      )  # fmt: skip
      pending = []
    if done % c.train.checkpoint_every == 0 or done == num_steps:
      r.ckpt.save(done, state, {"step": done, "seed": int(c.seed)})
  r.ckpt.wait()
  r.state = state
  return time.time() - start


def train_translation(
    config: ml_collections.ConfigDict, workdir: str
) -> dict[str, Any]:
  """Trains (resuming from ``workdir``), then scores ``eval_splits`` with
  beam search and sacreBLEU; writes ``results.json`` and the translations.
  """
  r = _prepare(config, workdir)
  try:
    seconds = _loop(r, workdir)
  finally:
    r.ckpt.close()
  vocab = parallel.load_vocabulary(r.vocab_path)
  tr = make_translator(config, r.model, r.state.params, vocab)
  results: dict[str, Any] = {
      "step": int(jax.device_get(r.state.step)),
      "train_seconds": seconds,
      "num_params": int(
          sum(np.prod(x.shape) for x in jax.tree.leaves(r.state.params))
      ),
      "unit": "bleu",
  }
  os.makedirs(os.path.join(workdir, "translations"), exist_ok=True)
  for split in config.translation.eval_splits:
    data = read_split(config, split, r.vocab_path, workdir)
    scores = score_split(
        tr, data, config.translation.eval_max_sentences, f"decoding {split}"
    )
    hyps = scores.pop("hypotheses")
    path = os.path.join(workdir, "translations", f"{split}.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(hyps) + "\n")
    console.info("%s", bleu.summary(scores, split))
    results[split] = scores
  runfiles.write_json(os.path.join(workdir, "results.json"), results)
  return results
