"""Translation as a training task (``config.task = 'translation'``).

Training goes through the same loop as every language model
(``memjax.run.loop``: ``--mode=train``), with this task supplying what differs:
the parallel splits and their joint sentencepiece vocabulary (trained on the
training split, or ``translation.vocab_file``, or the one a run saved), the
token batches' size for throughput, and evaluation by beam search scored
with sacreBLEU (periodically on ``translation.eval_max_sentences`` of each
evaluation split, and on the whole splits at the end, with the translations
written to ``<workdir>/translations/<split>.txt``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import Mesh

from memjax import errors
from memjax import settings as settings_lib
from memjax.data import parallel
from memjax.data import token_batching
from memjax.io import console
from memjax.io import paths
from memjax.run import spec
from memjax.tasks import base as task
from memjax.tasks import config as task_config
from memjax.tasks.translation import bleu
from memjax.tasks.translation import parts

# Scalars logged per split (the rest of sacreBLEU's output goes to files).
_LOGGED = ("bleu", "chrf", "bleu_lowercase")


@dataclasses.dataclass
class ParallelData:
  """The splits of a translation run.

  Attributes:
    name: 'parallel <src>-<tgt>'.
    vocab_size: V of the joint vocabulary.
    vocab_path: the sentencepiece model file.
    vocab: the ``seqio.SentencePieceVocabulary``.
    train: the training ``parallel.ParallelSplit`` (None when not read).
    splits: evaluation splits by name.
    cache_dir: where encoded splits are cached.
  """

  name: str
  vocab_size: int
  vocab_path: str
  vocab: Any
  train: Any
  splits: dict[str, Any]
  cache_dir: str


class _BleuEvaluator(task.Evaluator):
  """Beam search over each evaluation split, scored with sacreBLEU."""

  def __init__(
      self,
      t: task_config.Translation,
      model: Any,
      data: ParallelData,
      out_dir: str = "",
  ):
    self.t, self.model, self.data = t, model, data
    self.out_dir = out_dir

  def run(self, params, step, max_items, prefix="", writer=None):
    tr = parts.make_translator(self.t, self.model, params, self.data.vocab)
    res = {}
    for split, data in self.data.splits.items():
      scores = parts.score_split(
          tr, data, max_items, f"{prefix}{split} @ step {step}: decoding"
      )
      hyps = scores.pop("hypotheses")
      if self.out_dir and jax.process_index() == 0:
        paths.makedirs(self.out_dir)
        path = paths.join(self.out_dir, f"{split}.txt")
        with paths.open(path, "w", encoding="utf-8") as f:
          f.write("\n".join(hyps) + "\n")
      console.info("%s", bleu.summary(scores, f"{prefix}{split}"))
      res[split] = scores
      if writer is not None:
        writer.write_scalars(
            step,
            {
                f"{prefix}{split}/{k}": float(scores[k])
                for k in _LOGGED
                if k in scores
            },
        )
    return res


class Translation(task.Task):
  """Sentence-level translation of ``translation.source_lang`` into
  ``translation.target_lang`` with an encoder-decoder."""

  @property
  def t(self) -> task_config.Translation:
    return self.settings.of(task_config.Translation)

  def check_settings(self) -> None:
    parts.check_settings(self.settings)

  def data_settings(self) -> dict[str, Any]:
    # The batches depend on the languages, max_tokens and buckets; the
    # vocabulary on the languages and vocab_size (a translation.vocab_file
    # is checked against the run's own by its SHA-1 instead).
    t = self.t
    settings = {
        "translation.source_lang": t.source_lang,
        "translation.target_lang": t.target_lang,
        "translation.max_tokens": int(t.max_tokens),
        "translation.buckets": [int(b) for b in t.buckets],
    }
    if not t.vocab_file:
      settings["translation.vocab_size"] = int(t.vocab_size)
    return settings

  def check_data(self, train=True, workdir=""):
    t, s = self.t, self.settings
    splits = (("train",) if train else ()) + tuple(t.eval_splits)
    for split in splits:
      try:
        parallel.split_files(
            parts.data_dir(s.data), split, t.source_lang, t.target_lang
        )
      except errors.DataError:
        # Without its files, a split the run's cache holds is read there.
        if not (
            (workdir or s.data.cache_dir) and parts.is_cached(s, workdir, split)
        ):
          raise

  def load(self, workdir, train=True) -> ParallelData:
    t = self.t
    splits = (("train",) if train else ()) + tuple(t.eval_splits)
    parts.check_tokenizer(self.settings, workdir, splits)
    vocab_path = parts.vocabulary_path(self.settings, workdir)
    vocab = parallel.load_vocabulary(vocab_path)
    read = lambda s: parts.read_split(self.settings, s, vocab_path, workdir)
    return ParallelData(
        name=f"parallel {t.source_lang}-{t.target_lang}",
        vocab_size=int(vocab.vocab_size),
        vocab_path=vocab_path,
        vocab=vocab,
        train=read("train") if train else None,
        splits={s: read(s) for s in t.eval_splits},
        cache_dir=parts.cache_dir(self.settings, workdir),
    )

  def describe(self, data: ParallelData) -> str:
    splits = ", ".join(f"{k} {len(v.source)}" for k, v in data.splits.items())
    train = f", train {len(data.train.source)} pairs" if data.train else ""
    return f"{data.name}: vocabulary {data.vocab_size}{train}, {splits}"

  def vocabulary(self, workdir) -> Any:
    return parallel.load_vocabulary(
        parts.vocabulary_path(self.settings, workdir)
    )

  def tokens_per_step(self) -> int:
    return int(self.t.max_tokens)

  def check_batch_fits(self, mesh: Mesh, carries_memory: bool) -> None:
    # The token batcher rounds every bucket's rows to the data-parallel
    # size itself (``token_batching.TokenBatcher``).
    del mesh, carries_memory

  def evaluator(self, run: spec.Run, model, data) -> task.Evaluator:
    return _BleuEvaluator(self.t, model, data)

  def final_results(
      self, run: spec.Run, model, params, data, step, writer=None
  ) -> dict[str, Any]:
    evaluator = _BleuEvaluator(
        self.t, model, data, paths.join(run.workdir, "translations")
    )
    results = {"name": self.settings.name, "step": step, "unit": "bleu"}
    scores = evaluator.run(
        params, step, int(self.t.eval_max_sentences), "", writer
    )
    results.update(scores)
    results["summary_lines"] = [bleu.summary(v, k) for k, v in scores.items()]
    return results


def token_shapes(s: settings_lib.Settings, devices: int) -> dict[str, Any]:
  """The arrays of a 'tokens' batch of the longest bucket (the most memory
  and attention per token) on ``devices`` devices: 'source', 'inputs',
  'targets' [rows, L] int32, 'weights' [rows, L] float32."""
  t = s.of(task_config.Translation)
  length = max(int(b) for b in t.buckets)
  multiple = max(1, devices // max(1, int(s.mesh.tensor)))
  rows = max(int(t.max_tokens) // length // multiple, 1) * multiple
  out = {k: ((rows, length), "int32") for k in ("source", "inputs", "targets")}
  out["weights"] = ((rows, length), "float32")
  return out


def token_batcher(
    s: settings_lib.Settings, train: Any, cache_dir: str
) -> token_batching.TokenBatcher:
  """The 'tokens' batcher over a ``parallel.ParallelSplit``."""
  del cache_dir
  t = s.of(task_config.Translation)
  # The batch is split over the data, fsdp and memory axes: every device
  # but the tensor-parallel ones.
  devices = max(1, jax.device_count() // max(1, int(s.mesh.tensor)))
  return token_batching.TokenBatcher(
      train.source,
      train.target,
      max_tokens=int(t.max_tokens),
      buckets=tuple(t.buckets),
      seed=int(s.seed),
      row_multiple=devices,
  )
