"""``--mode=marge_eval``: the MARGE LM with retrieval on and off.

Each evaluation split's documents (articles, or sections with
``position_loss.documents = 'sections'``) are cut into segments of N tokens
like the training documents. Every segment of the training split and of the
split is embedded with the run's current parameters (e(.)); each window
S_t S_{t+1} of an evaluated document retrieves its K sources by e(S_t) from
the training segments and its own S_0..S_{t-1} (never another evaluated
document, never S_t or later: ``SegmentTable.allowed`` with ``pool``), by
exact search. The N tokens of S_{t+1} are scored with those sources and
with none (retrieval off), so the two numbers cover the same tokens; the
tokens of each document's S_0 have no causal query and are not scored.

Writes ``<workdir>/marge_eval.json``: the run's beta and, per split,
perplexity with and without
retrieval, the loss by position bucket (``position_loss.buckets``) of
both, and under 'examples' what the first ``EXAMPLES`` windows retrieved
(token ids of S_t, S_{t+1} and each source with its similarity).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from memjax import errors
from memjax.data import corpus as corpus_lib
from memjax.eval import scorer as scorer_lib
from memjax.io import paths
from memjax.methods.marge import config as marge_config
from memjax.methods.marge import model as marge_model
from memjax.methods.marge import reindex as marge_index
from memjax.methods.marge import retrieval as marge_lib
from memjax.modes import position_loss as pl
from memjax.run import restore
from memjax.run import spec


def eval_table(
    train: Any, tokens: np.ndarray, starts: np.ndarray, n: int
) -> tuple[marge_lib.SegmentTable, int]:
  """Segments of the training documents then of the evaluated ones, and
  the number of training segments (the ``pool``)."""
  joint = np.concatenate([np.asarray(train.tokens), np.asarray(tokens)])
  offset = len(train.tokens)
  doc_starts = np.concatenate([train.doc_starts, np.asarray(starts) + offset])
  table = marge_lib.SegmentTable.build(joint, doc_starts, n)
  return table, int(np.sum(table.start < offset))


# The windows of each split whose sources marge_eval.json shows.
EXAMPLES = 3


def _ids(tokens: np.ndarray) -> list[int]:
  return [int(t) for t in np.asarray(tokens).reshape(-1)]


def examples(
    table: marge_lib.SegmentTable,
    emb: np.ndarray,
    query: np.ndarray,
    sources: np.ndarray,
    pool: int,
) -> list[dict[str, Any]]:
  """What each query segment retrieved, as token ids.

  Args:
    table: the segments (``eval_table``).
    emb: [M, D] e(.) of every segment.
    query: [Q] ids of the query segments S_t.
    sources: [Q, K] their source segment ids, best first (-1: none).
    pool: the number of training segments (ids >= pool are the evaluated
      documents', i.e. the query's own past).

  Returns:
    Per query: {'segment': S_t [N], 'next': S_{t+1} [N], 'sources': per
    source {'similarity': e(S_t).e(source), 'segment': [N], 'continuation':
    the segment after it [N] ([] at a document's end), 'own_past': bool}}.
  """
  out = []
  for q, row in zip(query, sources):
    found = []
    for j in row[row >= 0]:
      nxt = table.next[j]
      found.append(
          {
              "similarity": float(np.dot(emb[q], emb[j])),
              "segment": _ids(table.segment_tokens(j)),
              "continuation": _ids(table.segment_tokens(nxt))
              if nxt >= 0
              else [],
              "own_past": bool(j >= pool),
          }
      )
    out.append(
        {
            "segment": _ids(table.segment_tokens(q)),
            "next": _ids(table.segment_tokens(table.next[q])),
            "sources": found,
        }
    )
  return out


def score(scorer: Any, params: Any, batch: dict, retrieval: bool) -> np.ndarray:
  """[W, 2N] nll of the windows, with their sources or with none (through
  the run's ``memjax.eval`` scorer, in batches of ``eval.batch_size``)."""
  keys = ("inputs", "targets") + (
      ("sources", "source_mask") if retrieval else ()
  )
  out = scorer.rows(
      params, {k: batch[k] for k in keys}, keep=("target_logprob",)
  )
  return -np.asarray(out["target_logprob"])


def _split(
    restored: restore.Restored,
    train: Any,
    stream: Any,
    documents: str,
    bounds: tuple[int, ...],
    search: str,
) -> dict[str, Any]:
  """Results of one split (see the module docstring)."""
  model = restored.model
  n, k = model.segment_len, model.num_sources
  tokens = np.asarray(stream.tokens)
  extra = np.zeros(0, np.int64)
  if documents == "sections":
    extra = pl.section_starts(
        tokens, restored.vocab.token_to_id("="), restored.vocab.eos_id
    )
  starts = pl.document_spans(len(tokens), stream.doc_starts, extra)[:, 0]
  table, pool = eval_table(train, tokens, starts, n)
  emb = marge_index.embed_all(
      model,
      restored.variables,
      table.segment_tokens(np.arange(len(table))),
      256,
      restored.mesh,
  )
  index = marge_lib.SegmentIndex(table, emb, search, pool=pool)
  query = table.targets[table.targets >= pool]
  max_windows = restored.settings.eval.max_windows
  if max_windows:
    query = query[:max_windows]
  sources = index.topk(query, k)
  batch = marge_lib.window_arrays(table, query, sources)
  w = batch["weights"] > 0
  offset = (table.pos[query][:, None] + 1) * n + np.arange(2 * n) - (n - 1)
  positions = np.broadcast_to(offset, w.shape)[w]
  out: dict[str, Any] = dict(windows=int(len(query)), tokens=int(w.sum()))
  scorer = scorer_lib.scorer_for(restored.scoring())
  for name, on in (("retrieval", True), ("no_retrieval", False)):
    nll = score(scorer, restored.variables, batch, on)[w]
    out[name] = dict(
        nll=float(nll.mean()),
        ppl=float(np.exp(nll.mean())),
        buckets=pl.bucket_means(positions, nll, bounds),
    )
  own = (batch["source_ids"] >= pool) & (batch["source_ids"] >= 0)
  out["own_past_share"] = float(
      own.sum() / max((batch["source_ids"] >= 0).sum(), 1)
  )
  out["examples"] = examples(
      table, emb, query[:EXAMPLES], sources[:EXAMPLES], pool
  )
  return out


def marge_eval(run: spec.Run) -> dict[str, Any]:
  """``--mode=marge_eval`` (see the module docstring)."""
  s, workdir = run.settings, run.workdir
  documents, bounds, _ = pl.check(s.of(pl.PositionLoss))
  restored = restore.restore_source(run)
  corpus = corpus_lib.load_corpus(s.data, s.eval, workdir, train=False)
  if not isinstance(restored.model, marge_model.MargeLM):
    raise errors.ConfigError(
        "--mode=marge_eval needs a run of model.family 'marge'"
    )
  train = corpus_lib.load_corpus(
      s.data, s.eval, workdir, splits=(), train=True
  ).train
  search = s.of(marge_config.Marge).search
  beta = float(jax.device_get(restored.params["beta"]))
  results: dict[str, Any] = dict(
      step=restored.step, documents=documents, beta=beta
  )
  lines = []
  for split, stream in corpus.splits.items():
    r = _split(restored, train, stream, documents, bounds, search)
    results[split] = r
    lines.append(
        f"{split}: ppl with retrieval {r['retrieval']['ppl']:.2f}, without "
        f"{r['no_retrieval']['ppl']:.2f} ({r['tokens']} tokens of S_t+1, "
        f"{r['own_past_share']:.0%} of sources from the own past)"
    )
    for a, b in zip(r["retrieval"]["buckets"], r["no_retrieval"]["buckets"]):
      if a["nll"] is not None:
        lines.append(
            f"  positions {a['bucket']:>8}: nll {a['nll']:.4f} with, "
            f"{b['nll']:.4f} without ({a['tokens']} tokens)"
        )
  path = paths.join(workdir, "marge_eval.json")
  if jax.process_index() == 0:
    paths.write_json(path, results)
  return dict(results, summary_lines=lines, results_path=path)
