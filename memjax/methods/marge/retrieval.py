"""Causal retrieval and batches for the modified-MARGE LM ('marge').

The training documents are cut into segments of N tokens (a trailing part
shorter than N is dropped). A training example is a window S_t S_{t+1} of
one document with K sources: segments retrieved by e(S_t) from the index of
all training segments, each followed by its continuation (the next segment
of its document, padding after a document's last segment).

Causality: a candidate of the example's own document is allowed only if it
comes before S_t (S_0..S_{t-1}); S_t itself, S_{t+1} and later are masked.
Search fetches k + (the longest document's segment count) neighbours, so
after the mask at least k remain whenever the corpus has them; exact search
(``search='exact'``, ``search.exact_topk``) finds the true top-k, ScaNN
(``'scann'``, ``search.build_shard_index``, values = segment ids) an
approximation.

The index holds e(.) of every training segment, computed by the step hook
``marge_reindex`` with the parameters of its step; the query of a training
example is its own row of that index (both sides equally stale, nothing to
recompute per step). Until the first index, and for the first
``same_doc_steps`` steps (§5.4: poorly initialised clusters train slowly),
a batch is made of sub-batches of ``sub_batch`` windows of one document,
whose sources are that document's most recent past segments.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.memory import search as search_lib
from memjax.methods.marge import config as marge_config

SEARCHES = ("exact", "scann")


@dataclasses.dataclass
class SegmentTable:
  """The N-token segments of a token stream's documents.

  Attributes:
    tokens: [T] int32 the stream.
    segment_len: N.
    start: [M] int64 first token of each segment.
    doc: [M] int32 document of each segment.
    pos: [M] int32 index t of the segment within its document.
    next: [M] int32 id of the next segment of the document, -1 after the
      last.
  """

  tokens: np.ndarray
  segment_len: int
  start: np.ndarray
  doc: np.ndarray
  pos: np.ndarray
  next: np.ndarray

  @classmethod
  def build(
      cls, tokens: np.ndarray, doc_starts: np.ndarray, segment_len: int
  ) -> "SegmentTable":
    """Cuts each document [doc_starts[i], doc_starts[i+1]) into segments."""
    tokens = np.asarray(tokens, np.int32)
    bounds = np.append(np.asarray(doc_starts, np.int64), len(tokens))
    start, doc, pos = [], [], []
    for d in range(len(bounds) - 1):
      n = int(bounds[d + 1] - bounds[d]) // segment_len
      start.append(bounds[d] + segment_len * np.arange(n, dtype=np.int64))
      doc.append(np.full(n, d, np.int32))
      pos.append(np.arange(n, dtype=np.int32))
    start, doc, pos = (np.concatenate(a) for a in (start, doc, pos))
    nxt = np.arange(1, len(start) + 1, dtype=np.int32)
    last = np.append(doc[1:] != doc[:-1], True) if len(doc) else doc
    nxt[last.astype(bool)] = -1
    return cls(tokens, segment_len, start, doc, pos, nxt)

  def __len__(self) -> int:
    return len(self.start)

  @property
  def targets(self) -> np.ndarray:
    """Ids of segments S_t that have an S_{t+1} (valid queries)."""
    return np.flatnonzero(self.next >= 0)

  @property
  def longest_document(self) -> int:
    """Segments in the longest document."""
    return int(self.pos.max()) + 1 if len(self) else 0

  def segment_tokens(self, ids: np.ndarray) -> np.ndarray:
    """[...] segment ids -> [..., N] tokens."""
    return self.tokens[self.start[ids][..., None] + np.arange(self.segment_len)]

  def allowed(
      self, query: np.ndarray, cand: np.ndarray, pool: Optional[int] = None
  ) -> np.ndarray:
    """[Q], [Q, C] segment ids -> [Q, C] bool: the causal mask.

    A candidate is allowed unless it is invalid (-1) or of the query's
    document at or after the query (S_t, S_{t+1}, ...). With ``pool``
    (evaluation: the training segments are ids < pool, the evaluated
    documents follow), a candidate >= pool is allowed only from the
    query's own past.
    """
    c = np.maximum(cand, 0)
    same = self.doc[c] == self.doc[query][:, None]
    later = self.pos[c] >= self.pos[query][:, None]
    ok = (cand >= 0) & ~(same & later)
    if pool is not None:
      ok &= (cand < pool) | same
    return ok


def causal_topk(
    table: SegmentTable,
    scores: np.ndarray,
    cand: np.ndarray,
    query,
    k: int,
    pool: Optional[int] = None,
) -> np.ndarray:
  """First k allowed candidates of each row (by descending score); -1 pads.

  Args:
    table: the segments.
    scores: [Q, C] candidate scores.
    cand: [Q, C] candidate segment ids (-1 = none).
    query: [Q] query segment ids.
    k: sources per query.
    pool: see ``SegmentTable.allowed``.

  Returns:
    [Q, k] int32 segment ids.
  """
  ok = table.allowed(np.asarray(query), cand, pool)
  s = np.where(ok, scores, -np.inf)
  order = np.argsort(-s, axis=1, kind="stable")[:, :k]
  picked = np.take_along_axis(cand, order, 1)
  good = np.take_along_axis(ok, order, 1)
  out = np.where(good, picked, -1).astype(np.int32)
  if out.shape[1] < k:
    out = np.pad(out, ((0, 0), (0, k - out.shape[1])), constant_values=-1)
  return out


class SegmentIndex:
  """Search over the embeddings [M, D] of every training segment."""

  def __init__(
      self,
      table: SegmentTable,
      emb: np.ndarray,
      search: str,
      pool: Optional[int] = None,
  ):
    if search not in SEARCHES:
      raise errors.ConfigError(
          f"marge.search must be one of {SEARCHES}, got {search!r}"
      )
    if emb.shape[0] != len(table):
      raise errors.ConfigError(
          f"the MARGE index has {emb.shape[0]} rows but the corpus has "
          f"{len(table)} segments of {table.segment_len} tokens: it was "
          "built for another corpus or segment_len; rebuild it"
      )
    self.table, self.emb, self.search = table, emb.astype(np.float32), search
    self.pool = pool
    # Enough neighbours that k survive the causal mask (and, at evaluation,
    # the other evaluated documents).
    extra = 0 if pool is None else len(table) - pool
    self.fetch = min(len(table), table.longest_document + extra)
    self._scann = None
    if search == "scann":
      self._scann = search_lib.build_shard_index(
          self.emb, "dot_product", self.fetch
      )

  def nearest(self, q: np.ndarray, fetch: int) -> tuple[np.ndarray, ...]:
    """Queries [Q, D] -> (scores [Q, C] float32, segment ids [Q, C]
    int64) of their ``fetch`` best segments by dot product, best first."""
    fetch = min(len(self.table), fetch)
    if self._scann is None:
      s, c = search_lib.exact_topk(q, self.emb, fetch, "dot_product")
    else:
      c, s = self._scann.search_batched(q, final_num_neighbors=fetch)
    return np.asarray(s, np.float32), np.asarray(c, np.int64)

  def topk(self, query: np.ndarray, k: int) -> np.ndarray:
    """[Q] query segment ids -> [Q, k] causal top-k segment ids (-1 pads)."""
    s, c = self.nearest(self.emb[query], self.fetch + k)
    return causal_topk(self.table, s, c, query, k, self.pool)


def window_arrays(
    table: SegmentTable, query: np.ndarray, sources: np.ndarray
) -> dict[str, np.ndarray]:
  """The batch of windows S_t S_{t+1} and their sources.

  Args:
    table: the segments.
    query: [B] ids of S_t (each with an S_{t+1}).
    sources: [B, K] source segment ids, -1 = empty slot.

  Returns:
    inputs, targets [B, 2N] int32; weights [B, 2N] float32 (1 on the N
    targets of S_{t+1}); sources [B, K, 2N] int32 (segment then
    continuation); source_mask [B, K, 2N] bool; source_ids [B, K].
  """
  n = table.segment_len
  toks = np.append(table.tokens, 0)
  idx = table.start[query][:, None] + np.arange(2 * n + 1)
  window = toks[np.minimum(idx, len(toks) - 1)]
  weights = np.zeros((len(query), 2 * n), np.float32)
  weights[:, n - 1 : 2 * n - 1] = 1.0
  s = np.maximum(sources, 0)
  nxt = table.next[s]
  seg = table.segment_tokens(s)
  cont = table.segment_tokens(np.maximum(nxt, 0))
  src = np.concatenate([seg, cont], axis=-1)
  mask = np.concatenate(
      [
          np.repeat((sources >= 0)[..., None], n, -1),
          np.repeat(((sources >= 0) & (nxt >= 0))[..., None], n, -1),
      ],
      axis=-1,
  )
  return dict(
      inputs=window[:, :-1].astype(np.int32),
      targets=window[:, 1:].astype(np.int32),
      weights=weights,
      sources=np.where(mask, src, 0).astype(np.int32),
      source_mask=mask,
      source_ids=sources.astype(np.int32),
  )


class MargeBatcher:
  """Training batches of windows with retrieved sources (a pure function of
  the step and of the index in use)."""

  def __init__(
      self,
      table: SegmentTable,
      batch_size: int,
      num_sources: int,
      *,
      seed: int = 0,
      same_doc_steps: int = 0,
      sub_batch: int = 4,
      search: str = "exact",
  ):
    self.table, self.batch_size, self.k = table, batch_size, num_sources
    self.seed, self.same_doc_steps = seed, same_doc_steps
    self.sub_batch, self.search = max(1, sub_batch), search
    self.index: Optional[SegmentIndex] = None
    self._targets = table.targets
    if not len(self._targets):
      raise errors.DataError(
          f"no training document has two segments of {table.segment_len} "
          "tokens; lower model.family_options.segment_len"
      )
    self._docs = np.unique(table.doc[self._targets])

  def use_index(self, emb: np.ndarray) -> None:
    """Retrieves from now on with the embeddings ``emb`` [M, D]."""
    self.index = SegmentIndex(self.table, emb, self.search)

  def same_doc_sources(self, query: np.ndarray) -> np.ndarray:
    """[B] -> [B, K] each query's most recent past segments (-1 pads)."""
    back = self.table.pos[query][:, None] - 1 - np.arange(self.k)[None]
    return np.where(back >= 0, query[:, None] - 1 - np.arange(self.k), -1)

  def batch(self, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, step])
    if step < self.same_doc_steps or self.index is None:
      groups = -(-self.batch_size // self.sub_batch)
      docs = rng.choice(self._docs, groups)
      query = np.concatenate(
          [
              rng.choice(
                  self._targets[self.table.doc[self._targets] == d],
                  self.sub_batch,
              )
              for d in docs
          ]
      )[: self.batch_size]
      sources = self.same_doc_sources(query)
    else:
      query = rng.choice(self._targets, self.batch_size)
      sources = self.index.topk(query, self.k)
    return window_arrays(self.table, query, sources)


def table_of(m: settings_lib.Model, train: Any) -> SegmentTable:
  """The segment table of the training stream for the model settings."""
  n = int(m.family_options.get("segment_len", 16))
  if 2 * n > int(m.max_len) or n < 1:
    raise errors.ConfigError(
        f"model.family_options.segment_len {n} must be positive with 2N <= "
        f"model.max_len {m.max_len}"
    )
  return SegmentTable.build(train.tokens, train.doc_starts, n)


def marge_shapes(s: settings_lib.Settings, devices: int) -> dict[str, Any]:
  """The arrays of ``window_arrays`` a train step takes (N = segment_len,
  K = num_sources)."""
  del devices
  opts = s.model.family_options
  b = int(s.data.batch_size)
  n2 = 2 * int(opts.get("segment_len", 16))
  k = int(opts.get("num_sources", 4))
  return {
      "inputs": ((b, n2), "int32"),
      "targets": ((b, n2), "int32"),
      "weights": ((b, n2), "float32"),
      "sources": ((b, k, n2), "int32"),
      "source_mask": ((b, k, n2), "bool"),
  }


def marge_batcher(
    s: settings_lib.Settings, train: Any, cache_dir: str
) -> MargeBatcher:
  """Windows S_t S_{t+1} with K causally retrieved sources."""
  del cache_dir
  opts = s.model.family_options
  n = int(opts.get("segment_len", 16))
  if s.data.seq_len != 2 * n:
    raise errors.ConfigError(
        f"data.seq_len {s.data.seq_len} must be 2 * "
        f"model.family_options.segment_len ({2 * n}) for batching 'marge'"
    )
  table = table_of(s.model, train)
  k = int(opts.get("num_sources", 4))
  if k > len(table) - 1:
    raise errors.ConfigError(
        f"model.family_options.num_sources {k} exceeds the {len(table) - 1} "
        "candidate segments of the corpus"
    )
  return MargeBatcher(
      table,
      s.data.batch_size,
      k,
      seed=s.seed,
      **dataclasses.asdict(s.of(marge_config.Marge)),
  )
