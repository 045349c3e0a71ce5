"""``--mode=position_loss``: mean loss by position within a document.

The early-token analysis of Komatsuzaki (2021, Appendix 6.3.4): a token's
position is its offset in its document (the first token, not predicted, is
0), and the loss of each split is averaged in buckets of positions (1-16,
17-64, 65-256, 257+ by default, ``position_loss.buckets``). The context is
reset at document boundaries: each document is scored on its own with the
sliding windows of ``eval.window_len`` / ``eval.score_len`` (Baevski & Auli),
so no window crosses into the previous document. Documents are the corpus's
articles or, with ``position_loss.documents = 'sections'``, the article
sections too (a line ``= = Heading = =`` starts a new one), so the five demo
test articles give enough documents.

How a document is scored follows the model, not its name (the run's scorer,
``memjax.eval.scorer_for``):

* a model that carries memory (``model.carries_memory()``: Transformer-XL,
  LaMemo) reads each document as one lane from an empty memory, in segments
  of ``eval.segment_len`` (default ``data.seq_len``) with its memory
  (``eval.mem_len``, default ``model.mem_len``) carried within the document;
* with ``position_loss.memory = 'eval'``, a windowed model reads its
  evaluation memory as ``--mode=memeval`` and ``memjax.load(...).score``
  do (``tune.json``'s setting, else ``eval_memory``; e.g. ``knn``, the
  kNN-LM, with its datastore), each document its own stream, so a kNN-LM
  row is the LM's run scored with ``--config.eval_memory.kind=knn``;
* otherwise the model alone on the windows (the MARGE model with retrieval
  off, so its row measures what its weights learnt).

Writes ``<workdir>/position_loss.json`` and ``position_loss.png``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import jax
import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.data import corpus as corpus_lib
from memjax.eval import scorer as scorer_lib
from memjax.io import paths
from memjax.run import restore
from memjax.run import spec


@dataclasses.dataclass(frozen=True)
class PositionLoss:
  """``config.position_loss``: --mode=position_loss, the mean loss by
  position within a document, context reset at document boundaries
  (Komatsuzaki 2021, Appendix 6.3.4).

  Attributes:
    documents: articles | sections.
    buckets: lower bounds of the position buckets.
    memory: none (the model alone; a model that carries memory carries it
      within each document) | eval (a windowed model with its evaluation
      memory: tune.json, else eval_memory).
  """

  SECTION: ClassVar[str] = "position_loss"
  documents: str = "articles"
  buckets: tuple[int, ...] = (1, 17, 65, 257)
  memory: str = "none"


BUCKETS = (1, 17, 65, 257)  # bucket lower bounds: 1-16, 17-64, 65-256, 257+
DOCUMENTS = ("articles", "sections")
MEMORIES = ("none", "eval")


def bucket_labels(bounds: Sequence[int]) -> list[str]:
  """['1-16', '17-64', ..., '257+'] for lower bounds (1, 17, ..., 257)."""
  hi = [f"-{b - 1}" for b in bounds[1:]] + ["+"]
  return [f"{a}{h}" for a, h in zip(bounds, hi)]


def section_starts(tokens: np.ndarray, eq_id: int, eos_id: int) -> np.ndarray:
  """Offsets of lines starting '= =' (section headings), after an EOS."""
  t = np.asarray(tokens)
  i = np.flatnonzero((t[1:-1] == eq_id) & (t[2:] == eq_id) & (t[:-2] == eos_id))
  return i + 1


def document_spans(
    num_tokens: int, doc_starts: np.ndarray, extra: np.ndarray = ()
) -> np.ndarray:
  """[D, 2] (start, end) of the documents cut at ``doc_starts`` and
  ``extra`` (sorted, de-duplicated; empty documents dropped)."""
  cuts = np.unique(np.concatenate([[0], doc_starts, extra, [num_tokens]]))
  cuts = cuts[(cuts >= 0) & (cuts <= num_tokens)].astype(np.int64)
  spans = np.stack([cuts[:-1], cuts[1:]], axis=1)
  return spans[spans[:, 1] - spans[:, 0] >= 2]


def bucket_means(
    positions: np.ndarray, nll: np.ndarray, bounds: Sequence[int]
) -> list[dict[str, Any]]:
  """Mean nll per bucket of positions (positions 0 are not scored)."""
  b = np.searchsorted(np.asarray(bounds), positions, side="right") - 1
  out = []
  for i, label in enumerate(bucket_labels(bounds)):
    m = (b == i) & (positions > 0)
    n = int(m.sum())
    out.append(
        dict(bucket=label, tokens=n, nll=float(nll[m].mean()) if n else None)
    )
  return out


def document_scores(
    scorer: Any, params: Any, tokens: np.ndarray, spans: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """(positions [P], nll [P]) of every scored prediction of the documents
  (``spans`` [D, 2] of ``tokens``), each document read from an empty
  context; a prediction's position is its offset in its document (from 1).
  ``eval.max_windows`` bounds the windows of a windowed model."""
  max_windows = int(scorer.scoring.eval.max_windows)
  logp = scorer.document_logprobs(params, tokens, spans, max_windows)
  pos = [np.arange(1, len(lp) + 1, dtype=np.int64) for lp in logp]
  nll = [-np.asarray(lp, np.float32) for lp in logp]
  return (
      np.concatenate([np.zeros(0, np.int64)] + pos),
      np.concatenate([np.zeros(0, np.float32)] + nll),
  )


def run_scorer(restored: restore.Restored, workdir: str, memory: str) -> Any:
  """How the run's documents are scored (see the module docstring)."""
  if memory == "none":
    return scorer_lib.scorer_for(restored.scoring())
  if restored.model.carries_memory():
    raise errors.ConfigError(
        "position_loss.memory 'eval' reads an evaluation memory over "
        "sliding windows; this model carries its own memory (scored with "
        "it already): set position_loss.memory to 'none'"
    )
  scoring = restored.scoring()
  setting = scorer_lib.memory_setting(scoring)
  return scorer_lib.scorer_for(scoring, setting, workdir=workdir)


def check(p: settings_lib.PositionLoss) -> tuple[str, tuple[int, ...], str]:
  """(documents, bucket bounds, memory) of the ``position_loss`` settings.

  Raises:
    errors.ConfigError: a value out of what each takes.
  """
  bounds = tuple(int(b) for b in p.buckets)
  if p.documents not in DOCUMENTS:
    raise errors.ConfigError(
        f"position_loss.documents must be one of {DOCUMENTS}, got "
        f"{p.documents!r}"
    )
  if p.memory not in MEMORIES:
    raise errors.ConfigError(
        f"position_loss.memory must be one of {MEMORIES}, got {p.memory!r}"
    )
  if not bounds or bounds[0] != 1 or list(bounds) != sorted(set(bounds)):
    raise errors.ConfigError(
        f"position_loss.buckets must rise from 1, got {bounds}"
    )
  return p.documents, bounds, p.memory


def position_loss(run: spec.Run) -> dict[str, Any]:
  """``--mode=position_loss``: the loss by position table and plot."""
  documents, bounds, memory = check(run.settings.of(PositionLoss))
  workdir = run.workdir
  restored = restore.restore_source(run)
  s = run.settings
  corpus = corpus_lib.load_corpus(s.data, s.eval, workdir, train=False)
  scorer = run_scorer(restored, workdir, memory)
  results: dict[str, Any] = dict(
      documents=documents,
      step=restored.step,
      checkpoint=restored.path,
      memory=memory,
  )
  for split, stream in corpus.splits.items():
    tokens = np.asarray(stream.tokens)
    extra = np.zeros(0, np.int64)
    if documents == "sections":
      vocab = restored.vocab
      extra = section_starts(tokens, vocab.token_to_id("="), vocab.eos_id)
    spans = document_spans(len(tokens), stream.doc_starts, extra)
    scores = document_scores(scorer, restored.variables, tokens, spans)
    rows = bucket_means(*scores, bounds)
    results[split] = dict(documents=len(spans), buckets=rows)
    print(f"{split}: {len(spans)} {documents}")
    for r in rows:
      nll_ = "-" if r["nll"] is None else f"{r['nll']:.4f}"
      print(f"  positions {r['bucket']:>8}: nll {nll_} ({r['tokens']} tokens)")
  files = [paths.join(workdir, f"position_loss.{x}") for x in ("json", "png")]
  if jax.process_index() == 0:
    paths.makedirs(workdir)
    paths.write_json(files[0], results)
    plot(results, files[1])
  return dict(results, files=files)


def plot(results: dict[str, Any], path: str) -> None:
  """Mean nll by position bucket, one line per split."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(5, 3.2))
  for split, r in results.items():
    if not isinstance(r, dict) or "buckets" not in r:
      continue
    rows = [b for b in r["buckets"] if b["nll"] is not None]
    ax.plot(
        [b["bucket"] for b in rows], [b["nll"] for b in rows], "o-", label=split
    )
  ax.set_xlabel("position in document")
  ax.set_ylabel("mean loss (nats)")
  ax.set_title(f"loss by position ({results['documents']})")
  ax.legend()
  fig.tight_layout()
  paths.savefig(fig, path, dpi=100)
  plt.close(fig)
