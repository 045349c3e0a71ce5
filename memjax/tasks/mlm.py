"""Masked language modelling as a training task (``config.task = 'mlm'``).

BERT-style pretraining without the next-sentence task (RoBERTa): the
pretraining corpus (``mlm.data_dir``, WikiText files; default the shipped
demo copy) is read with a sentencepiece vocabulary trained on its training
split (``memjax.data.mlm``), batched by the 'mlm' batcher (15% of tokens
chosen, 80/10/10), and trained through the same loop and 'lm' objective:
the batch's weights keep the loss at the chosen positions only.

Evaluation: MLM perplexity, ``exp`` of the mean negative log-likelihood of
the chosen tokens over the non-overlapping windows of each split in
``eval.splits``, masked with a fixed draw (``mlm.eval_seed``), so every
checkpoint and every model sees the same corrupted inputs. The same pass
adds up the per-slot sums of every registered sum report
(``memjax.models.variables.SumReport``) and puts what each says in the results: with
product-key memory layers, MU, top-1 MU, KL_u and KL_w per memory layer
(Kim & Jung's Table 2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.checkpoints import runfiles
from memjax.data import batchers
from memjax.data import content
from memjax.data import mlm
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.io import console
from memjax.io import paths
from memjax.run import spec
from memjax.tasks import base as task
from memjax.tasks import config as task_config

Settings = settings_lib.Settings


@dataclasses.dataclass
class TrainStream:
  """The training stream with what the batcher needs to mask it."""

  tokens: np.ndarray
  cls_id: int
  mask_id: int
  vocab_size: int


@dataclasses.dataclass
class MLMData:
  """The splits of a masked-LM run (``task.Task.load``)."""

  name: str
  vocab_size: int
  vocab_path: str
  vocab: Any
  train: Any
  splits: dict[str, np.ndarray]
  cache_dir: str
  cls_id: int
  mask_id: int


def data_dir(m: task_config.MaskedLM) -> str:
  return m.data_dir or mlm.DEFAULT_DIR


def vocabulary_path(s: Settings, workdir: str) -> str:
  """``mlm.vocab_file``, else the one the run saved, else a trained one."""
  m = s.of(task_config.MaskedLM)
  if m.vocab_file:
    if not paths.isfile(m.vocab_file):
      raise errors.DataError(f"mlm.vocab_file {m.vocab_file} does not exist")
    return paths.local_file(m.vocab_file)
  saved = paths.join(workdir, runfiles.SPM_FILE)
  if paths.isfile(saved):
    return paths.local_file(saved)  # sentencepiece reads local files.
  return mlm.train_vocabulary(
      data_dir(m), int(m.vocab_size), cache_dir(s, workdir)
  )


def cache_dir(s: Settings, workdir: str) -> str:
  """The run's cache: ``data.cache_dir``, else ``<workdir>/cache``."""
  return s.data.cache_dir or paths.join(workdir, "cache")


def is_cached(s: Settings, workdir: str, split: str) -> bool:
  """Whether the run's cache holds ``split`` encoded with the run's
  vocabulary, so that it is read without its text file; writes nothing."""
  m = s.of(task_config.MaskedLM)
  cache = cache_dir(s, workdir)
  saved = paths.join(workdir, runfiles.SPM_FILE) if workdir else ""
  try:
    if m.vocab_file:
      vocab = m.vocab_file
    elif saved and paths.isfile(saved):
      vocab = saved
    else:
      vocab = mlm.vocabulary_file(
          data_dir(m), int(m.vocab_size), cache, remember=False
      )
    if not paths.isfile(vocab):
      return False
    path = mlm.split_file(data_dir(m), split, vocab, cache, remember=False)
  except content.AmbiguousCacheError:
    raise
  except errors.DataError:
    return False
  return paths.isfile(path)


def eval_batches(
    stream: np.ndarray,
    seq_len: int,
    cls_id: int,
    mask_id: int,
    vocab_size: int,
    *,
    seed: int,
    mask_prob: float,
    max_windows: int = 0,
) -> dict[str, np.ndarray]:
  """The split's windows (``mlm.windows``) masked with a fixed draw."""
  rows = mlm.windows(stream, seq_len, cls_id)
  if max_windows:
    rows = rows[:max_windows]
  return mlm.mask_tokens(
      rows,
      np.random.default_rng(seed),
      mask_id=mask_id,
      first_ordinary=mask_id + 1,
      vocab_size=vocab_size,
      mask_prob=mask_prob,
  )


class MLMEvaluator(task.Evaluator):
  """MLM perplexity (and what the registered sum reports add, e.g. memory
  usage) on each evaluation split."""

  def __init__(self, scoring: rows.Scoring, s: Settings, data: MLMData):
    self.seq_len = int(s.data.seq_len)
    self.m = s.of(task_config.MaskedLM)
    self.data = data
    self.scorer = scorer_lib.scorer_for(scoring)
    self.reports = scoring.sum_reports
    self._batches: dict[tuple[str, int], dict[str, np.ndarray]] = {}

  def batches(self, split: str, max_items: int) -> dict[str, np.ndarray]:
    key = (split, max_items)
    if key not in self._batches:
      self._batches[key] = eval_batches(
          self.data.splits[split],
          self.seq_len,
          self.data.cls_id,
          self.data.mask_id,
          self.data.vocab_size,
          seed=int(self.m.eval_seed) + sorted(self.data.splits).index(split),
          mask_prob=float(self.m.mask_prob),
          max_windows=max_items,
      )
    return self._batches[key]

  def score(self, params, split: str, max_items: int) -> dict[str, Any]:
    """{'ppl', 'masked_tokens', <report key>: {module: metrics}} of a split
    (the masked windows in batches of ``eval.batch_size``; padding rows
    carry no weight and read no memory slot)."""
    out = self.scorer.rows(
        params,
        self.batches(split, max_items),
        collections=tuple(r.collection for r in self.reports),
    )
    count = float(out.get("tokens", 0.0))
    ppl = float(np.exp(float(out.get("nll_sum", 0.0)) / max(count, 1.0)))
    res = {"ppl": ppl, "masked_tokens": count}
    for report in self.reports:
      by_module = report.by_module(out[report.collection])
      if by_module:
        res[report.key] = by_module
    return res

  def run(self, params, step, max_items, prefix="", writer=None):
    res = {}
    for split in self.data.splits:
      r = res[split] = self.score(params, split, max_items)
      console.info(
          "%s%s @ step %d: MLM perplexity %.3f over %d masked tokens%s",
          prefix,
          split,
          step,
          r["ppl"],
          int(r["masked_tokens"]),
          "".join(
              f"; {module.split('/')[0]} {report.brief(m)}"
              for report in self.reports
              for module, m in r.get(report.key, {}).items()
          ),
      )
      if writer is not None:
        scalars = {f"{prefix}{split}/ppl": r["ppl"]}
        for report in self.reports:
          for module, m in r.get(report.key, {}).items():
            for name in report.scalars:
              scalars[f"{prefix}{split}/{module.split('/')[0]}/{name}"] = m[
                  name
              ]
        writer.write_scalars(step, scalars)
    return res


class MaskedLanguageModelling(task.Task):
  """BERT-style masked LM over ``mlm.data_dir`` (see the module doc)."""

  @property
  def m(self) -> task_config.MaskedLM:
    return self.settings.of(task_config.MaskedLM)

  def check_settings(self) -> None:
    s = self.settings
    if s.model.family != "encoder":
      raise errors.ConfigError(
          f"task 'mlm' needs model.family 'encoder', got {s.model.family!r}"
      )
    if s.data.batching != "mlm":
      raise errors.ConfigError(
          f"task 'mlm' needs data.batching 'mlm', got {s.data.batching!r}"
      )
    p = float(self.m.mask_prob)
    if not 0.0 < p < 1.0:
      raise errors.ConfigError(f"mlm.mask_prob must be in (0, 1), got {p}")
    if s.data.seq_len > s.model.max_len:
      raise errors.ConfigError(
          f"data.seq_len {s.data.seq_len} exceeds model.max_len "
          f"{s.model.max_len}"
      )

  def check_data(self, train=True, workdir=""):
    s = self.settings
    splits = (("train",) if train else ()) + tuple(s.eval.splits)
    for split in splits:
      try:
        mlm.split_path(data_dir(self.m), split)
      except errors.DataError:
        # Without its file, a split the run's cache holds is read there.
        if not ((workdir or s.data.cache_dir) and is_cached(s, workdir, split)):
          raise

  def load(self, workdir, train=True) -> MLMData:
    s = self.settings
    vocab_path = vocabulary_path(s, workdir)
    vocab = mlm.load_vocabulary(vocab_path)
    cls_id, mask_id = mlm.special_ids(vocab)
    cache = cache_dir(s, workdir)
    read = lambda x: mlm.read_split(data_dir(self.m), x, vocab_path, cache)
    v = int(vocab.vocab_size)
    return MLMData(
        name=f"masked LM on {data_dir(self.m)}",
        vocab_size=v,
        vocab_path=vocab_path,
        vocab=vocab,
        train=TrainStream(read("train"), cls_id, mask_id, v) if train else None,
        splits={x: read(x) for x in s.eval.splits},
        cache_dir=cache,
        cls_id=cls_id,
        mask_id=mask_id,
    )

  def describe(self, data: MLMData) -> str:
    splits = ", ".join(f"{k} {len(v)}" for k, v in data.splits.items())
    train = f", train {len(data.train.tokens)} tokens" if data.train else ""
    return f"{data.name}: vocabulary {data.vocab_size}{train}, {splits}"

  def vocabulary(self, workdir) -> Any:
    return mlm.load_vocabulary(vocabulary_path(self.settings, workdir))

  def tokens_per_step(self) -> int:
    d = self.settings.data
    return int(d.batch_size * d.seq_len)

  def evaluator(self, run: spec.Run, model, data) -> task.Evaluator:
    return MLMEvaluator(run.scoring(model), self.settings, data)

  def final_results(
      self, run: spec.Run, model, params, data, step, writer=None
  ) -> dict[str, Any]:
    s = self.settings
    evaluator = MLMEvaluator(run.scoring(model), s, data)
    scores = evaluator.run(params, step, int(s.eval.max_windows), "", writer)
    results = {"name": s.name, "step": step, "unit": "ppl"}
    results.update(scores)
    lines = []
    for split, x in scores.items():
      lines.append(f"{split}: MLM perplexity {x['ppl']:.3f}")
      for report in evaluator.reports:
        for module, m in x.get(report.key, {}).items():
          lines.append(f"  {module}: {report.describe(m)}")
    results["summary_lines"] = lines
    return results


def mlm_shapes(s: Settings, devices: int) -> batchers.BatchShapes:
  """'inputs', 'targets' [B, L] int32 and 'weights' [B, L] float32."""
  out = batchers.segment_shapes(s, devices)
  out["weights"] = (out["inputs"][0], "float32")
  return out


def make_mlm_batcher(s: Settings, train: Any, cache_dir: str) -> mlm.MLMBatcher:
  """The 'mlm' batcher over an ``MLMData``'s training stream."""
  del cache_dir
  return mlm.MLMBatcher(
      train.tokens,
      seq_len=int(s.data.seq_len),
      batch_size=int(s.data.batch_size),
      seed=int(s.seed),
      cls_id=train.cls_id,
      mask_id=train.mask_id,
      vocab_size=train.vocab_size,
      mask_prob=float(s.of(task_config.MaskedLM).mask_prob),
  )
