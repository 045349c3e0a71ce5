"""Sentence classification as a training task (``task='classification'``).

Fine-tuning a pretrained encoder (``model.family='encoder'`` with
``family_options.head='classify'``; start from an MLM run with
``train.init_from``) on GLUE-style TSV files (``memjax.data.glue``), through
the same loop and 'lm' objective: the loss is the cross-entropy of the
label (``targets[:, 0]``).

The vocabulary is the pretrained model's: ``mlm.vocab_file``, else the one
this run saved, else the one the ``train.init_from`` run saved, else one
trained on the MLM corpus (a classifier from scratch).

Evaluation: accuracy on ``classification.select_split`` (dev) at every
``train.eval_every`` and at the end; the run keeps the parameters of the
best dev accuracy (earliest on ties) as an export in ``<workdir>/best_dev``
(``experiment.load`` restores it; a resumed run starts from it) and scores
``test_split`` once, with those. The final results also hold, at the best
parameters, what every registered sum report (``memjax.models.stats.SumReport``)
says over ``usage_split`` and its comparison of the positive and negative
examples: with product-key memory layers, each layer's usage (MU, top-1
MU, KL_u, KL_w; Kim & Jung's Table 6) and the top-1 usage KL and IOU of
the two classes (their Figure 4).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional

import flax
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from memjax.io import console
from memjax import errors
from memjax import experiment
from memjax.io import paths
from memjax import registry
from memjax.checkpoints import runfiles
from memjax.models import stats
from memjax.tasks import base as task
from memjax.data import glue
from memjax.data import mlm
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.models import state as model_state
from memjax.tasks import mlm as mlm_task

BEST_DIR = "best_dev"


@dataclasses.dataclass
class ClassData:
  """The splits of a classification run; ``best`` holds the best dev
  evaluation so far ({'accuracy', 'step', 'params'}: on the host, or None
  when restored from ``best_dir``, the export it is kept in while
  training)."""

  name: str
  vocab_size: int
  vocab_path: str
  vocab: Any
  train: Optional[glue.Examples]
  splits: dict[str, glue.Examples]
  cache_dir: str
  best_dir: Optional[str] = None
  best: dict[str, Any] = dataclasses.field(default_factory=dict)


def save_best(config, data: ClassData) -> None:
  """Writes ``data.best`` as an export in ``data.best_dir`` (if set)."""
  if not data.best_dir:
    return
  b = data.best
  meta = {
      "signature": experiment.model_signature(config, data.vocab_size),
      "step": b["step"],
      "dtype": "float32",
      "source": paths.dirname(data.best_dir),
      config.classification.select_split: {"accuracy": b["accuracy"]},
  }
  # ``params`` is what the evaluation scored: the parameters, or a
  # variables dict with the model state (``memjax.models.state``).
  variables = model_state.as_variables(b["params"])
  params = variables.pop("params")
  runfiles.write_export(
      data.best_dir, config, data.vocab, params, meta,
      model_state=variables or None,
  )  # fmt: skip


def read_best(config, best_dir: str) -> dict[str, Any]:
  """The best dev evaluation an earlier part of the run kept, or {}."""
  path = paths.join(best_dir, runfiles.EXPORT_FILE)
  if not paths.isfile(path):
    return {}
  meta = paths.read_json(path)
  split = config.classification.select_split
  return {"accuracy": meta[split]["accuracy"], "step": meta["step"],
          "params": None}  # fmt: skip


def best_params(data: ClassData, mesh: Mesh) -> Any:
  """The best dev parameters (restored from ``best_dir`` after a resume)."""
  if data.best["params"] is None:
    restored = experiment.load(data.best_dir, mesh=dict(mesh.shape))
    data.best["params"] = restored.variables
  return data.best["params"]


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
  """Share of rows whose highest score is at their label ([N, C], [N])."""
  labels = np.asarray(labels)
  if not len(labels):
    return 0.0
  return float(np.mean(np.argmax(np.asarray(logits), axis=-1) == labels))


def data_dir(config: ml_collections.ConfigDict) -> str:
  return config.classification.data_dir or glue.DEFAULT_DIR


def vocabulary_path(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The pretrained model's sentencepiece model (see the module doc)."""
  if config.mlm.vocab_file:
    return mlm_task.vocabulary_path(config, workdir)
  for run in (workdir, config.train.init_from):
    if run and paths.isfile(paths.join(run, runfiles.SPM_FILE)):
      # sentencepiece reads local files.
      return paths.local_file(paths.join(run, runfiles.SPM_FILE))
  return mlm_task.vocabulary_path(config, workdir)


def sentence_batches(
    ex: glue.Examples, config, mesh: Mesh, rows_: Optional[np.ndarray] = None
) -> Iterator[tuple[dict[str, np.ndarray], int]]:
  """(batch, real rows) of the examples ``rows_`` (default all) in batches
  of ``eval.batch_size`` (rounded up to the data-parallel devices), each
  padded to the shortest of ``classification.buckets`` that fits it (one
  compilation per bucket) and filled with empty rows, which read no
  memory slot and whose scores are dropped."""
  idx_all = np.arange(len(ex.ids)) if rows_ is None else np.asarray(rows_)
  size = rows.batch_rows(int(config.eval.batch_size), mesh)
  for first in range(0, len(idx_all), size):
    idx = idx_all[first : first + size]
    ids = [ex.ids[i] for i in idx]
    ids += [np.zeros((0,), np.int32)] * (size - len(ids))
    b = glue.pad_batch(ids, np.zeros(len(ids)), config.classification.buckets)
    yield {"inputs": b["inputs"]}, len(idx)


def predict(
    scorer, params, ex: glue.Examples, config, rows_=None
) -> tuple[np.ndarray, dict[str, Any]]:
  """(logits [N, C], {collection: sums} of every registered sum report)
  over the examples ``rows_`` (default all)."""
  collections = tuple(r.collection for r in stats.sum_reports())
  out = scorer.apply(
      params, sentence_batches(ex, config, scorer.mesh, rows_),
      keep=("logits",), collections=collections,
  )  # fmt: skip
  n = len(ex.ids) if rows_ is None else len(rows_)
  logits = out.get("logits", np.zeros((n, len(config.classification.labels))))
  return logits, {c: out[c] for c in collections}


class AccuracyEvaluator(task.Evaluator):
  """Accuracy on the selection split; keeps the best parameters."""

  def __init__(self, config, model, mesh: Mesh, data: ClassData):
    self.config, self.mesh, self.data = config, mesh, data
    self.scorer = scorer_lib.scorer_for(rows.RunView(config, model, mesh))

  def run(self, params, step, max_items, prefix="", writer=None):
    del max_items  # The selection split is always scored whole.
    split = self.config.classification.select_split
    ex = self.data.splits[split]
    logits, _ = predict(self.scorer, params, ex, self.config)
    acc = accuracy(logits, ex.labels)
    best = self.data.best
    if not best or acc > best["accuracy"]:
      best.update(accuracy=acc, step=int(step), params=jax.device_get(params))
      save_best(self.config, self.data)
    console.info(
        "%s%s @ step %d: accuracy %.4f (best %.4f at step %d)", prefix,
        split, step, acc, best["accuracy"], best["step"],
    )  # fmt: skip
    if writer is not None:
      writer.write_scalars(step, {f"{prefix}{split}/accuracy": acc})
    return {split: {"accuracy": acc}}


def usage_analysis(scorer, params, ex, config) -> dict[str, Any]:
  """What the registered sum reports say over ``ex`` (e.g. memory usage)
  and, with two labels, their comparison of the positive and negative
  examples ('class_divergence'); empty when nothing was sown."""
  _, sums = predict(scorer, params, ex, config)
  out: dict[str, Any] = {}
  labels = tuple(config.classification.labels)
  for report in stats.sum_reports():
    by_module = report.by_module(sums[report.collection])
    if not by_module:
      continue
    out[report.key] = by_module
    if len(labels) == 2 and report.compare is not None:
      pos, neg = (
          predict(scorer, params, ex, config, np.flatnonzero(ex.labels == c))[
              1
          ][report.collection]
          for c in (1, 0)
      )
      out["class_divergence"] = report.compare(pos, neg)
  return out


@registry.TASKS.register("classification")
class Classification(task.Task):
  """Sentence classification from ``classification.data_dir`` TSV files."""

  def check_config(self, config: ml_collections.ConfigDict) -> None:
    m, c = config.model, config.classification
    head = (m.family_options or {}).get("head", "mlm")
    if m.family != "encoder" or head != "classify":
      raise errors.ConfigError(
          "task 'classification' needs model.family 'encoder' with "
          "model.family_options.head 'classify'"
      )
    if config.data.batching != "sentences":
      raise errors.ConfigError(
          "task 'classification' needs data.batching 'sentences', got "
          f"{config.data.batching!r}"
      )
    n = int((m.family_options or {}).get("num_classes", 2))
    if n != len(c.labels):
      raise errors.ConfigError(
          f"model.family_options.num_classes {n} differs from the "
          f"{len(c.labels)} classification.labels {tuple(c.labels)}"
      )
    if max(c.buckets) > m.max_len or c.max_len > max(c.buckets):
      raise errors.ConfigError(
          f"classification.max_len {c.max_len} must fit the last of "
          f"classification.buckets {tuple(c.buckets)}, which must fit "
          f"model.max_len {m.max_len}"
      )

  def _splits(self, config, train):
    c = config.classification
    names = {c.select_split, c.test_split, c.usage_split}
    return (("train",) if train else ()) + tuple(sorted(names))

  def check_data(self, config, train=True):
    labels = tuple(config.classification.labels)
    for split in self._splits(config, train):
      glue.read_tsv(glue.split_path(data_dir(config), split), labels)

  def load(self, config, workdir, train=True) -> ClassData:
    vocab_path = vocabulary_path(config, workdir)
    vocab = mlm.load_vocabulary(vocab_path)
    cls_id, _ = mlm.special_ids(vocab)
    c = config.classification

    def read(split):
      path = glue.split_path(data_dir(config), split)
      text, labels = glue.read_tsv(path, tuple(c.labels))
      return glue.encode_examples(text, labels, vocab, cls_id, c.max_len)

    splits = {s: read(s) for s in self._splits(config, False)}
    best_dir = paths.join(workdir, BEST_DIR) if train else None
    return ClassData(
        name=f"classification on {data_dir(config)}",
        vocab_size=int(vocab.vocab_size), vocab_path=vocab_path, vocab=vocab,
        train=read("train") if train else None, splits=splits,
        cache_dir=config.data.cache_dir or paths.join(workdir, "cache"),
        best_dir=best_dir, best=read_best(config, best_dir) if train else {},
    )  # fmt: skip

  def describe(self, data: ClassData) -> str:
    splits = ", ".join(f"{k} {len(v.ids)}" for k, v in data.splits.items())
    train = f", train {len(data.train.ids)} sentences" if data.train else ""
    return f"{data.name}: vocabulary {data.vocab_size}{train}, {splits}"

  def vocabulary(self, config, workdir) -> Any:
    return mlm.load_vocabulary(vocabulary_path(config, workdir))

  def tokens_per_step(self, config) -> int:
    return int(config.data.batch_size * config.classification.max_len)

  def evaluator(self, config, model, mesh, data) -> task.Evaluator:
    return AccuracyEvaluator(config, model, mesh, data)

  def final_results(
      self, config, model, params, mesh, data, step, writer=None
  ) -> dict[str, Any]:
    c = config.classification
    ev = AccuracyEvaluator(config, model, mesh, data)
    ev.run(params, step, 0, "", writer)
    best = data.best
    params = best_params(data, mesh)
    test = data.splits[c.test_split]
    logits, _ = predict(ev.scorer, params, test, config)
    results = {
        "name": config.name, "step": step, "unit": "accuracy",
        c.select_split: {"accuracy": best["accuracy"]},
        c.test_split: {"accuracy": accuracy(logits, test.labels)},
        "best_step": best["step"],
    }  # fmt: skip
    results.update(
        usage_analysis(ev.scorer, params, data.splits[c.usage_split], config)
    )
    lines = [
        f"best {c.select_split} accuracy {best['accuracy']:.4f} at step "
        f"{best['step']}; {c.test_split} accuracy there "
        f"{results[c.test_split]['accuracy']:.4f}"
    ]
    for report in stats.sum_reports():
      for module, m in results.get(report.key, {}).items():
        d = results.get("class_divergence", {}).get(module, {})
        lines.append(
            f"  {module}: {report.describe(m)}; positive vs negative "
            f"{report.describe_comparison(d)}"
        )
    results["summary_lines"] = lines
    return results
