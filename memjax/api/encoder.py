"""``MaskedLM`` and ``Classifier``: BERT-style encoder runs restored.

    mlm = memjax.load("runs/pkm_bert_demo/c/mlm")    # task 'mlm'
    mlm.score(["the cat sat on the mat ."])          # masked-token log p
    mlm.usage(texts)                                 # memory layers' usage
    cls = memjax.load("runs/pkm_bert_demo/c/cls_seed0")  # 'classification'
    cls.predict(["a fine film ."])                   # labels, probabilities
    cls.usage(texts, labels)                         # usage by class
    cls.usage(texts, labels)["slot_sums"]            # per-slot counts

Both score through ``memjax.eval``'s rows scorer as the tasks' evaluations
do (``memjax.tasks.mlm``, ``memjax.tasks.classification``): sentences are
padded to a few length buckets in batches of ``eval.batch_size``, so N
sentences compile once per bucket. Memory usage is what every registered
sum report (``memjax.models.variables.SumReport``) says, e.g. MU, top-1 MU and KL of
each product-key memory layer.
"""

from __future__ import annotations

import zlib
from typing import Any, Optional, Sequence

import numpy as np

from memjax.api import base
from memjax.data import glue
from memjax.data import mlm
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.models import variables as model_vars
from memjax.run import restore
from memjax.tasks import classification
from memjax.tasks import config as task_config


def _bucket(length: int, cap: int) -> int:
  """The next power of two >= ``length`` (at least 8), at most ``cap``."""
  return min(cap, max(8, 1 << (max(1, length) - 1).bit_length()))


def _reports(
    reports: Sequence[Any], sums: dict[str, Any], raw: bool = False
) -> dict[str, Any]:
  """{report key: {module: metrics}} of the sum reports that were sown;
  raw: {report key: {module: {sum name: [K] array}}} instead."""
  out = {}
  for report in reports:
    collection = sums.get(report.collection) or {}
    by_module = (
        model_vars.module_sums(collection)
        if raw
        else report.by_module(collection)
    )
    if by_module:
      out[report.key] = by_module
  return out


class MaskedLM(base.Loaded):
  """A masked-LM encoder: masked-token scores and memory usage.

  Attributes:
    restored: the underlying ``memjax.run.restore.Restored``.
    settings: the run's settings (``mlm.mask_prob``: the share masked).
    vocab: its sentencepiece vocabulary ([CLS] and [MASK] pieces).
  """

  def __init__(self, restored: restore.Restored):
    super().__init__(restored)
    self.cls_id, self.mask_id = mlm.special_ids(self.vocab)
    self._scorer = scorer_lib.scorer_for(restored.scoring())

  def encode(self, text: str) -> np.ndarray:
    """[CLS] + the text's pieces, cut to ``model.max_len``: [n] int32."""
    ids = mlm.encode(self.vocab, [text])[0]
    cap = int(self.settings.model.max_len)
    return np.concatenate([[self.cls_id], ids[: cap - 1]]).astype(np.int32)

  def score(
      self,
      texts: Sequence[str],
      *,
      seed: int = 0,
      mask_prob: Optional[float] = None,
  ) -> dict[str, Any]:
    """Log-probabilities of masked tokens (BERT's 80/10/10 corruption).

    Args:
      texts: N texts, each read as one row ([CLS] first).
      seed: the masking draw (one seed and text, one set of masked
        positions).
      mask_prob: the share of tokens chosen (default ``mlm.mask_prob``).

    Returns:
      {'positions': [int array [k_i] of chosen positions per text],
      'logprobs': [float32 array [k_i] per text], 'nll': mean nats per
      chosen token, 'tokens': their number, 'ppl', 'usage': {report key:
      {module: metrics}} over these inputs (empty without memory layers)}.
    """
    ids = [self.encode(t) for t in texts]
    own = self.settings.of(task_config.MaskedLM).mask_prob
    p = float(own if mask_prob is None else mask_prob)
    # Each text's draw depends on the seed and the text only, so a text is
    # masked alike alone or among others.
    masked = [
        mlm.mask_tokens(
            x[None],
            np.random.default_rng([seed, zlib.crc32(t.encode())]),
            mask_id=self.mask_id,
            first_ordinary=self.mask_id + 1,
            vocab_size=int(self.restored.vocab_size),
            mask_prob=p,
        )
        for t, x in zip(texts, ids)
    ]
    reports = self._scorer.scoring.sum_reports
    collections = tuple(r.collection for r in reports)
    out = self._scorer.apply(
        self.restored.variables,
        self._batches(masked),
        keep=("target_logprob",),
        collections=collections,
    )
    positions = [np.flatnonzero(m["weights"][0]) for m in masked]
    per_row = out.get("target_logprob")
    logprobs = [np.asarray(per_row[i, pos]) for i, pos in enumerate(positions)]
    count = float(out.get("tokens", 0.0))
    nll = float(out.get("nll_sum", 0.0)) / max(count, 1.0)
    return {
        "positions": positions,
        "logprobs": logprobs,
        "nll": nll,
        "tokens": int(count),
        "ppl": float(np.exp(nll)),
        "usage": _reports(reports, out),
    }

  def usage(self, texts: Sequence[str], *, seed: int = 0) -> dict[str, Any]:
    """{report key: {module: metrics}} over ``texts`` masked as ``score``
    masks them: with memory layers, e.g. {'memory': {'layer_2/ffn':
    {'mu', 'top1_mu', 'kl_u', 'kl_w'}}}; {} without."""
    return self.score(texts, seed=seed)["usage"]

  def _batches(self, masked: Sequence[dict[str, np.ndarray]]):
    """(batch, real rows) of the masked rows in input order, each batch
    padded to its length bucket and to ``eval.batch_size`` rows."""
    size = rows.batch_rows(
        int(self.settings.eval.batch_size), self.restored.mesh
    )
    cap = int(self.settings.model.max_len)
    for first in range(0, len(masked), size):
      part = masked[first : first + size]
      length = _bucket(max(m["inputs"].shape[1] for m in part), cap)
      batch = {}
      for k in ("inputs", "targets", "weights"):
        a = np.zeros((size, length), part[0][k].dtype)
        for i, m in enumerate(part):
          a[i, : m[k].shape[1]] = m[k][0]
        batch[k] = a
      yield batch, len(part)


class Classifier(base.Loaded):
  """A fine-tuned encoder classifier: labels, probabilities, usage.

  Attributes:
    restored: the underlying ``memjax.run.restore.Restored`` (a
      classification run's best dev parameters when loaded without a step).
    settings: the run's settings.
    labels: the label names, in the order of the probabilities.
  """

  def __init__(self, restored: restore.Restored):
    super().__init__(restored)
    self.c = self.settings.of(task_config.Classification)
    self.labels = tuple(self.c.labels)
    self.cls_id, _ = mlm.special_ids(self.vocab)
    self._scorer = scorer_lib.scorer_for(restored.scoring())

  def _examples(
      self, sentences: Sequence[str], labels: Optional[Sequence[Any]] = None
  ) -> glue.Examples:
    index = np.zeros(len(sentences), np.int32)
    if labels is not None:
      names = {n: i for i, n in enumerate(self.labels)}
      index = np.asarray([names.get(l, l) for l in labels], np.int32)
    return glue.encode_examples(
        list(sentences),
        index,
        self.vocab,
        self.cls_id,
        int(self.c.max_len),
    )

  def predict(self, sentences: Sequence[str]) -> dict[str, Any]:
    """The label of each sentence.

    Args:
      sentences: N sentences.

    Returns:
      {'labels': N label names, 'probabilities': [N, C] float32 (softmax
      of the logits; C = len(self.labels)), 'logits': [N, C]}.
    """
    logits, _ = classification.predict(
        self._scorer,
        self.restored.variables,
        self._examples(sentences),
        self.c,
    )
    logits = np.asarray(logits, np.float32)
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = z / z.sum(axis=1, keepdims=True)
    return {
        "labels": [self.labels[i] for i in np.argmax(logits, axis=1)],
        "probabilities": probs,
        "logits": logits,
    }

  def usage(
      self, sentences: Sequence[str], labels: Optional[Sequence[Any]] = None
  ) -> dict[str, Any]:
    """Memory usage over ``sentences``, and per class.

    Args:
      sentences: N sentences.
      labels: their N labels (names or indices); None: the predicted ones.

    Returns:
      {report key: {module: metrics}} over all the sentences (e.g.
      'memory': MU, top-1 MU, KL per layer), 'by_class': {label name:
      {report key: {module: metrics}}} over each class's sentences, and,
      with two labels, 'class_divergence': the report's comparison of the
      two classes (top-1 usage KL and IOU, Kim & Jung's Figure 4), and
      'slot_sums': {label name: {report key: {module: {sum name: [K]
      float array}}}}, the per-slot sums behind each class's metrics (K
      slots; for a product-key memory layer 'reads', 'weights', 'top1' (the
      times each slot was some head's first choice) and their per-head
      counts); {} and empty classes without memory layers.
    """
    if labels is None:
      labels = self.predict(sentences)["labels"]
    ex = self._examples(sentences, labels)
    params = self.restored.variables
    out = classification.usage_analysis(self._scorer, params, ex, self.c)
    reports = self._scorer.scoring.sum_reports
    out["by_class"], out["slot_sums"] = {}, {}
    for index, name in enumerate(self.labels):
      rows_ = np.flatnonzero(ex.labels == index)
      if len(rows_):
        _, sums = classification.predict(
            self._scorer, params, ex, self.c, rows_
        )
        out["by_class"][name] = _reports(reports, sums)
        out["slot_sums"][name] = _reports(reports, sums, raw=True)
    return out
