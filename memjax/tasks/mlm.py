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
(``memjax.models.stats.SumReport``) and puts what each says in the results: with
product-key memory layers, MU, top-1 MU, KL_u and KL_w per memory layer
(Kim & Jung's Table 2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from memjax.io import console
from memjax import errors
from memjax.io import paths
from memjax import registry
from memjax.checkpoints import runfiles
from memjax.models import stats
from memjax.tasks import base as task
from memjax.data import mlm
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib


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


def data_dir(config: ml_collections.ConfigDict) -> str:
  return config.mlm.data_dir or mlm.DEFAULT_DIR


def vocabulary_path(config: ml_collections.ConfigDict, workdir: str) -> str:
  """``mlm.vocab_file``, else the one the run saved, else a trained one."""
  if config.mlm.vocab_file:
    if not paths.isfile(config.mlm.vocab_file):
      raise errors.DataError(
          f"mlm.vocab_file {config.mlm.vocab_file} does not exist"
      )
    return paths.local_file(config.mlm.vocab_file)
  saved = paths.join(workdir, runfiles.SPM_FILE)
  if paths.isfile(saved):
    return paths.local_file(saved)  # sentencepiece reads local files.
  cache = config.data.cache_dir or paths.join(workdir, "cache")
  return mlm.train_vocabulary(
      data_dir(config), int(config.mlm.vocab_size), cache
  )


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
      rows, np.random.default_rng(seed), mask_id=mask_id,
      first_ordinary=mask_id + 1, vocab_size=vocab_size, mask_prob=mask_prob,
  )  # fmt: skip


class MLMEvaluator(task.Evaluator):
  """MLM perplexity (and what the registered sum reports add, e.g. memory
  usage) on each evaluation split."""

  def __init__(self, config, model, mesh: Mesh, data: MLMData):
    self.config, self.mesh, self.data = config, mesh, data
    self.scorer = scorer_lib.scorer_for(rows.RunView(config, model, mesh))
    self.reports = stats.sum_reports()
    self._batches: dict[tuple[str, int], dict[str, np.ndarray]] = {}

  def batches(self, split: str, max_items: int) -> dict[str, np.ndarray]:
    key = (split, max_items)
    if key not in self._batches:
      c = self.config
      self._batches[key] = eval_batches(
          self.data.splits[split], int(c.data.seq_len), self.data.cls_id,
          self.data.mask_id, self.data.vocab_size,
          seed=int(c.mlm.eval_seed) + sorted(self.data.splits).index(split),
          mask_prob=float(c.mlm.mask_prob), max_windows=max_items,
      )  # fmt: skip
    return self._batches[key]

  def score(self, params, split: str, max_items: int) -> dict[str, Any]:
    """{'ppl', 'masked_tokens', <report key>: {module: metrics}} of a split
    (the masked windows in batches of ``eval.batch_size``; padding rows
    carry no weight and read no memory slot)."""
    out = self.scorer.rows(
        params, self.batches(split, max_items),
        collections=tuple(r.collection for r in self.reports),
    )  # fmt: skip
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
          prefix, split, step, r["ppl"], int(r["masked_tokens"]),
          "".join(
              f"; {module.split('/')[0]} {report.brief(m)}"
              for report in self.reports
              for module, m in r.get(report.key, {}).items()
          ),
      )  # fmt: skip
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


@registry.TASKS.register("mlm")
class MaskedLanguageModelling(task.Task):
  """BERT-style masked LM over ``mlm.data_dir`` (see the module doc)."""

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    if config.model.family != "encoder":
      raise errors.ConfigError(
          f"task 'mlm' needs model.family 'encoder', got "
          f"{config.model.family!r}"
      )
    if config.data.batching != "mlm":
      raise errors.ConfigError(
          f"task 'mlm' needs data.batching 'mlm', got "
          f"{config.data.batching!r}"
      )
    p = float(config.mlm.mask_prob)
    if not 0.0 < p < 1.0:
      raise errors.ConfigError(f"mlm.mask_prob must be in (0, 1), got {p}")
    if config.data.seq_len > config.model.max_len:
      raise errors.ConfigError(
          f"data.seq_len {config.data.seq_len} exceeds model.max_len "
          f"{config.model.max_len}"
      )

  def check_data(self, config, train=True):
    for split in (("train",) if train else ()) + tuple(config.eval.splits):
      mlm.split_path(data_dir(config), split)

  def load(self, config, workdir, train=True) -> MLMData:
    vocab_path = vocabulary_path(config, workdir)
    vocab = mlm.load_vocabulary(vocab_path)
    cls_id, mask_id = mlm.special_ids(vocab)
    cache = config.data.cache_dir or paths.join(workdir, "cache")
    read = lambda s: mlm.read_split(data_dir(config), s, vocab_path, cache)
    v = int(vocab.vocab_size)
    return MLMData(
        name=f"masked LM on {data_dir(config)}", vocab_size=v,
        vocab_path=vocab_path, vocab=vocab,
        train=TrainStream(read("train"), cls_id, mask_id, v) if train else None,
        splits={s: read(s) for s in config.eval.splits}, cache_dir=cache,
        cls_id=cls_id, mask_id=mask_id,
    )  # fmt: skip

  def describe(self, data: MLMData) -> str:
    splits = ", ".join(f"{k} {len(v)}" for k, v in data.splits.items())
    train = f", train {len(data.train.tokens)} tokens" if data.train else ""
    return f"{data.name}: vocabulary {data.vocab_size}{train}, {splits}"

  def vocabulary(self, config, workdir) -> Any:
    return mlm.load_vocabulary(vocabulary_path(config, workdir))

  def tokens_per_step(self, config) -> int:
    return int(config.data.batch_size * config.data.seq_len)

  def evaluator(self, config, model, mesh, data) -> task.Evaluator:
    return MLMEvaluator(config, model, mesh, data)

  def final_results(
      self, config, model, params, mesh, data, step, writer=None
  ) -> dict[str, Any]:
    scores = MLMEvaluator(config, model, mesh, data).run(
        params, step, int(config.eval.max_windows), "", writer
    )
    results = {"name": config.name, "step": step, "unit": "ppl"}
    results.update(scores)
    lines = []
    for split, s in scores.items():
      lines.append(f"{split}: MLM perplexity {s['ppl']:.3f}")
      for report in stats.sum_reports():
        for module, m in s.get(report.key, {}).items():
          lines.append(f"  {module}: {report.describe(m)}")
    results["summary_lines"] = lines
    return results
