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
(``memjax.dispatch.restore`` restores it; a resumed run starts from it) and scores
``test_split`` once, with those. The final results also hold, at the best
parameters, what every registered sum report (``memjax.models.variables.SumReport``)
says over ``usage_split`` and its comparison of the positive and negative
examples: with product-key memory layers, each layer's usage (MU, top-1
MU, KL_u, KL_w; Kim & Jung's Table 6) and the top-1 usage KL and IOU of
the two classes (their Figure 4).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional

import jax
import numpy as np
from jax.sharding import Mesh

from memjax import errors
from memjax import settings as settings_lib
from memjax.checkpoints import runfiles
from memjax.data import glue
from memjax.data import mlm
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.io import console
from memjax.io import paths
from memjax.models import variables as model_vars
from memjax.run import restore as restore_lib
from memjax.run import spec
from memjax.tasks import base as task
from memjax.tasks import config as task_config
from memjax.tasks import mlm as mlm_task

Settings = settings_lib.Settings
Classes = task_config.Classification

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


def save_best(run: spec.Run, data: ClassData) -> None:
  """Writes ``data.best`` as an export in ``data.best_dir`` (if set)."""
  if not data.best_dir:
    return
  b = data.best
  meta = {
      "signature": run.signature(data.vocab_size),
      "step": b["step"],
      "dtype": "float32",
      "source": paths.dirname(data.best_dir),
      run.settings.of(Classes).select_split: {"accuracy": b["accuracy"]},
  }
  # ``params`` is what the evaluation scored: the parameters, or a
  # variables dict with the model state (``memjax.models.variables``).
  variables = model_vars.as_variables(b["params"])
  params = variables.pop("params")
  runfiles.write_export(
      data.best_dir,
      run.config_json,
      data.vocab,
      params,
      meta,
      model_state=variables or None,
  )


def read_best(cs: Classes, best_dir: str) -> dict[str, Any]:
  """The best dev evaluation an earlier part of the run kept, or {}."""
  path = paths.join(best_dir, runfiles.EXPORT_FILE)
  if not paths.isfile(path):
    return {}
  meta = paths.read_json(path)
  return {
      "accuracy": meta[cs.select_split]["accuracy"],
      "step": meta["step"],
      "params": None,
  }


def best_params(run: spec.Run, model: Any, data: ClassData) -> Any:
  """The best dev parameters (restored from ``best_dir`` after a resume)."""
  if data.best["params"] is None:
    files = runfiles.find(data.best_dir)
    params, state, _ = restore_lib.export_variables(run, files, model)
    data.best["params"] = model_vars.as_variables(params, state)
  return data.best["params"]


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
  """Share of rows whose highest score is at their label ([N, C], [N])."""
  labels = np.asarray(labels)
  if not len(labels):
    return 0.0
  return float(np.mean(np.argmax(np.asarray(logits), axis=-1) == labels))


def data_dir(cs: Classes) -> str:
  return cs.data_dir or glue.DEFAULT_DIR


def vocabulary_path(s: Settings, workdir: str) -> str:
  """The pretrained model's sentencepiece model (see the module doc)."""
  if s.of(task_config.MaskedLM).vocab_file:
    return mlm_task.vocabulary_path(s, workdir)
  for run in (workdir, s.train.init_from):
    if run and paths.isfile(paths.join(run, runfiles.SPM_FILE)):
      # sentencepiece reads local files.
      return paths.local_file(paths.join(run, runfiles.SPM_FILE))
  return mlm_task.vocabulary_path(s, workdir)


def sentence_batches(
    ex: glue.Examples,
    batch_size: int,
    buckets: tuple[int, ...],
    mesh: Mesh,
    rows_: Optional[np.ndarray] = None,
) -> Iterator[tuple[dict[str, np.ndarray], int]]:
  """(batch, real rows) of the examples ``rows_`` (default all) in batches
  of ``eval.batch_size`` (rounded up to the data-parallel devices), each
  padded to the shortest of ``classification.buckets`` that fits it (one
  compilation per bucket) and filled with empty rows, which read no
  memory slot and whose scores are dropped."""
  idx_all = np.arange(len(ex.ids)) if rows_ is None else np.asarray(rows_)
  size = rows.batch_rows(int(batch_size), mesh)
  for first in range(0, len(idx_all), size):
    idx = idx_all[first : first + size]
    ids = [ex.ids[i] for i in idx]
    ids += [np.zeros((0,), np.int32)] * (size - len(ids))
    b = glue.pad_batch(ids, np.zeros(len(ids)), buckets)
    yield {"inputs": b["inputs"]}, len(idx)


def predict(
    scorer: Any, params: Any, ex: glue.Examples, cs: Classes, rows_: Any = None
) -> tuple[np.ndarray, dict[str, Any]]:
  """(logits [N, C], {collection: sums} of every sum report) over the
  examples ``rows_`` (default all)."""
  collections = tuple(r.collection for r in scorer.scoring.sum_reports)
  batches = sentence_batches(
      ex, scorer.scoring.eval.batch_size, tuple(cs.buckets), scorer.mesh, rows_
  )
  out = scorer.apply(params, batches, keep=("logits",), collections=collections)
  n = len(ex.ids) if rows_ is None else len(rows_)
  logits = out.get("logits", np.zeros((n, len(cs.labels))))
  return logits, {k: out[k] for k in collections}


class AccuracyEvaluator(task.Evaluator):
  """Accuracy on the selection split; keeps the best parameters."""

  def __init__(self, run: spec.Run, model: Any, data: ClassData):
    self.run_, self.data = run, data
    self.c = run.settings.of(Classes)
    self.scorer = scorer_lib.scorer_for(run.scoring(model))

  def run(self, params, step, max_items, prefix="", writer=None):
    del max_items  # The selection split is always scored whole.
    split = self.c.select_split
    ex = self.data.splits[split]
    logits, _ = predict(self.scorer, params, ex, self.c)
    acc = accuracy(logits, ex.labels)
    best = self.data.best
    if not best or acc > best["accuracy"]:
      best.update(accuracy=acc, step=int(step), params=jax.device_get(params))
      save_best(self.run_, self.data)
    console.info(
        "%s%s @ step %d: accuracy %.4f (best %.4f at step %d)",
        prefix,
        split,
        step,
        acc,
        best["accuracy"],
        best["step"],
    )
    if writer is not None:
      writer.write_scalars(step, {f"{prefix}{split}/accuracy": acc})
    return {split: {"accuracy": acc}}


def usage_analysis(scorer, params, ex, cs: Classes) -> dict[str, Any]:
  """What the sum reports say over ``ex`` (e.g. memory usage) and, with two
  labels, their comparison of the positive and negative examples
  ('class_divergence'); empty when nothing was sown."""
  _, sums = predict(scorer, params, ex, cs)
  out: dict[str, Any] = {}
  for report in scorer.scoring.sum_reports:
    by_module = report.by_module(sums[report.collection])
    if not by_module:
      continue
    out[report.key] = by_module
    if len(cs.labels) == 2 and report.compare is not None:
      pos, neg = (
          predict(scorer, params, ex, cs, np.flatnonzero(ex.labels == k))[1][
              report.collection
          ]
          for k in (1, 0)
      )
      out["class_divergence"] = report.compare(pos, neg)
  return out


class Classification(task.Task):
  """Sentence classification from ``classification.data_dir`` TSV files."""

  @property
  def c(self) -> Classes:
    return self.settings.of(Classes)

  def check_settings(self) -> None:
    m, c, d = self.settings.model, self.c, self.settings.data
    head = (m.family_options or {}).get("head", "mlm")
    if m.family != "encoder" or head != "classify":
      raise errors.ConfigError(
          "task 'classification' needs model.family 'encoder' with "
          "model.family_options.head 'classify'"
      )
    if d.batching != "sentences":
      raise errors.ConfigError(
          "task 'classification' needs data.batching 'sentences', got "
          f"{d.batching!r}"
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

  def chosen(self, files: runfiles.RunFiles) -> runfiles.RunFiles:
    """A run's best dev parameters (its ``best_dev`` export), the latest
    when it has none."""
    best = paths.join(files.path, BEST_DIR)
    if files.kind == "run" and paths.isfile(
        paths.join(best, runfiles.EXPORT_FILE)
    ):
      return runfiles.RunFiles("export", best)
    return files

  def _splits(self, train):
    c = self.c
    names = {c.select_split, c.test_split, c.usage_split}
    return (("train",) if train else ()) + tuple(sorted(names))

  def check_data(self, train=True, workdir=""):
    del workdir  # The TSV files are read on every run (they are small).
    labels = tuple(self.c.labels)
    for split in self._splits(train):
      glue.read_tsv(glue.split_path(data_dir(self.c), split), labels)

  def load(self, workdir, train=True) -> ClassData:
    vocab_path = vocabulary_path(self.settings, workdir)
    vocab = mlm.load_vocabulary(vocab_path)
    cls_id, _ = mlm.special_ids(vocab)
    c = self.c

    def read(split):
      path = glue.split_path(data_dir(c), split)
      text, labels = glue.read_tsv(path, tuple(c.labels))
      return glue.encode_examples(text, labels, vocab, cls_id, c.max_len)

    splits = {s: read(s) for s in self._splits(False)}
    best_dir = paths.join(workdir, BEST_DIR) if train else None
    cache = self.settings.data.cache_dir or paths.join(workdir, "cache")
    return ClassData(
        name=f"classification on {data_dir(c)}",
        vocab_size=int(vocab.vocab_size),
        vocab_path=vocab_path,
        vocab=vocab,
        train=read("train") if train else None,
        splits=splits,
        cache_dir=cache,
        best_dir=best_dir,
        best=read_best(c, best_dir) if train else {},
    )

  def describe(self, data: ClassData) -> str:
    splits = ", ".join(f"{k} {len(v.ids)}" for k, v in data.splits.items())
    train = f", train {len(data.train.ids)} sentences" if data.train else ""
    return f"{data.name}: vocabulary {data.vocab_size}{train}, {splits}"

  def vocabulary(self, workdir) -> Any:
    return mlm.load_vocabulary(vocabulary_path(self.settings, workdir))

  def tokens_per_step(self) -> int:
    return int(self.settings.data.batch_size * self.c.max_len)

  def evaluator(self, run: spec.Run, model, data) -> task.Evaluator:
    return AccuracyEvaluator(run, model, data)

  def final_results(
      self, run: spec.Run, model, params, data, step, writer=None
  ) -> dict[str, Any]:
    c = self.c
    ev = AccuracyEvaluator(run, model, data)
    ev.run(params, step, 0, "", writer)
    best = data.best
    params = best_params(run, model, data)
    test = data.splits[c.test_split]
    logits, _ = predict(ev.scorer, params, test, c)
    results = {
        "name": self.settings.name,
        "step": step,
        "unit": "accuracy",
        c.select_split: {"accuracy": best["accuracy"]},
        c.test_split: {"accuracy": accuracy(logits, test.labels)},
        "best_step": best["step"],
    }
    results.update(
        usage_analysis(ev.scorer, params, data.splits[c.usage_split], c)
    )
    lines = [
        f"best {c.select_split} accuracy {best['accuracy']:.4f} at step "
        f"{best['step']}; {c.test_split} accuracy there "
        f"{results[c.test_split]['accuracy']:.4f}"
    ]
    for report in ev.scorer.scoring.sum_reports:
      for module, m in results.get(report.key, {}).items():
        d = results.get("class_divergence", {}).get(module, {})
        lines.append(
            f"  {module}: {report.describe(m)}; positive vs negative "
            f"{report.describe_comparison(d)}"
        )
    results["summary_lines"] = lines
    return results


def sentence_shapes(s: Settings, devices: int) -> dict[str, Any]:
  """A 'sentences' batch of the longest bucket: 'inputs' [B, L] int32,
  'targets' [B, 1] int32, 'weights' [B, 1] float32."""
  del devices
  b = int(s.data.batch_size)
  length = max(int(x) for x in s.of(Classes).buckets)
  return {
      "inputs": ((b, length), "int32"),
      "targets": ((b, 1), "int32"),
      "weights": ((b, 1), "float32"),
  }


def make_sentence_batcher(
    s: Settings, train: Any, cache_dir: str
) -> glue.SentenceBatcher:
  """The 'sentences' batcher over the training ``Examples``."""
  del cache_dir
  return glue.SentenceBatcher(
      train,
      batch_size=int(s.data.batch_size),
      buckets=tuple(s.of(Classes).buckets),
      seed=int(s.seed),
  )
