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
adds up the product-key memories' per-slot sums and reports MU, top-1 MU,
KL_u and KL_w per memory layer (Kim & Jung's Table 2) in the results.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from memjax import console
from memjax import errors
from memjax.methods.pkm import usage as pkm_usage
from memjax import registry
from memjax import runfiles
from memjax import sharding as sharding_lib
from memjax import task
from memjax.data import mlm
from memjax.methods.pkm import layer as pkm


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
    if not os.path.isfile(config.mlm.vocab_file):
      raise errors.DataError(
          f"mlm.vocab_file {config.mlm.vocab_file} does not exist"
      )
    return config.mlm.vocab_file
  saved = os.path.join(workdir, runfiles.SPM_FILE)
  if os.path.isfile(saved):
    return saved
  cache = config.data.cache_dir or os.path.join(workdir, "cache")
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


def _score_fn(model, mesh: Mesh):
  """Jitted (params, batch) -> (nll sum, weight sum, pkm_usage sums)."""

  def score(params, batch):
    out, state = model.apply(
        {"params": params}, batch["inputs"], batch["targets"],
        mutable=[pkm.USAGE_COLLECTION],
    )  # fmt: skip
    w = batch["weights"]
    return (
        -jnp.sum(out.target_logprob * w),
        jnp.sum(w),
        state.get(pkm.USAGE_COLLECTION, {}),
    )

  return sharding_lib.under_mesh(jax.jit(score), mesh)


def run_batches(fn, params, arrays: dict[str, np.ndarray], batch_size, mesh):
  """Runs ``fn`` over rows of ``arrays`` in batches (rows padded to a
  multiple of the data-parallel devices with weight-0 padding rows, which
  read no memory slot); returns the outputs, added up."""
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  batch_size = max(dp, batch_size // dp * dp)
  n = len(next(iter(arrays.values())))
  total = None
  for first in range(0, n, batch_size):
    part = {k: v[first : first + batch_size] for k, v in arrays.items()}
    fill = -len(part["inputs"]) % dp
    if fill:
      part = {
          k: np.concatenate([v, np.zeros((fill,) + v.shape[1:], v.dtype)])
          for k, v in part.items()
      }
    got = jax.device_get(fn(params, sharding_lib.put_global_batch(part, mesh)))
    got = jax.tree.map(lambda x: np.asarray(x, np.float64), got)
    total = got if total is None else jax.tree.map(np.add, total, got)
  return total


def usage_metrics(sums: Any) -> dict[str, dict[str, float]]:
  """{memory layer: MU, top-1 MU, KL_u, KL_w} of 'pkm_usage' sums."""
  flat = flax.traverse_util.flatten_dict(sums, sep="/") if sums else {}
  layers: dict[str, dict[str, np.ndarray]] = {}
  for k, v in flat.items():
    layer, name = k.rsplit("/", 1)
    layers.setdefault(layer, {})[name] = v
  return {k: pkm_usage.metrics(v) for k, v in sorted(layers.items())}


class MLMEvaluator(task.Evaluator):
  """MLM perplexity (and memory usage) on each evaluation split."""

  def __init__(self, config, model, mesh: Mesh, data: MLMData):
    self.config, self.mesh, self.data = config, mesh, data
    self.fn = _score_fn(model, mesh)
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

  def run(self, params, step, max_items, prefix="", writer=None):
    res = {}
    for split in self.data.splits:
      nll, count, sums = run_batches(
          self.fn, params, self.batches(split, max_items),
          int(self.config.eval.batch_size), self.mesh,
      )  # fmt: skip
      ppl = float(np.exp(nll / max(count, 1.0)))
      res[split] = {"ppl": ppl, "masked_tokens": float(count)}
      usage = usage_metrics(sums)
      if usage:
        res[split]["memory"] = usage
      console.info(
          "%s%s @ step %d: MLM perplexity %.3f over %d masked tokens%s",
          prefix, split, step, ppl, int(count),
          "".join(
              f"; {k.split('/')[0]} top-1 MU {v['top1_mu']:.3f} "
              f"KL_u {v['kl_u']:.3f}"
              for k, v in usage.items()
          ),
      )  # fmt: skip
      if writer is not None:
        scalars = {f"{prefix}{split}/ppl": ppl}
        for k, v in usage.items():
          for name in ("mu", "top1_mu", "kl_u", "kl_w"):
            scalars[f"{prefix}{split}/{k.split('/')[0]}/{name}"] = v[name]
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
    cache = config.data.cache_dir or os.path.join(workdir, "cache")
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
      for layer, m in s.get("memory", {}).items():
        lines.append(
            f"  {layer}: MU {m['mu']:.4f}, top-1 MU {m['top1_mu']:.4f}, "
            f"KL_u {m['kl_u']:.4f}, KL_w {m['kl_w']:.4f}"
        )
    results["summary_lines"] = lines
    return results
