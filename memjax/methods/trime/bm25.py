"""BM25 packing of training segments into batches (TRIME, Appendix B).

TRIME_ext trains with the other segments of the batch as memory, so batches
should hold segments that overlap lexically (a proxy for the nearest
neighbours an external datastore returns at test time). Algorithm 1 of the
paper:

    l = []; c = None
    while segments remain:
        if c is None: c = a random unused segment
        l.append(c); mark c used
        c = the best-ranked unused segment among SimSeg(index, c, k), or None
    batches = consecutive groups of B in l

SimSeg(I, c, k) is the top-k of a BM25 search with the whole segment c as the
query (k = 20 in the paper). The chain runs across batch boundaries, so the
order does not depend on B; `batch_size` only says how the order is cut.

Implementation:

* The index is built with `bm25s` (Lucene BM25, k1 = 1.5, b = 0.75) over the
  segments' token ids, each id a term. Optional `stopword_ids` are removed
  before indexing, as the authors' Lucene (pyserini) analyser removes English
  stop words; by default nothing is removed.
* The query is the segment's bag of ids with multiplicities, the same score
  bm25s's own `retrieve` gives (sum over query tokens of the document's
  per-term weight). Segments that share no term with the query (score 0) are
  not hits, as in Lucene.
* Batched search. Because SimSeg depends only on the index and c, never on
  which segments are used, the top-k of every segment is computed up front
  for blocks of queries at once, then Algorithm 1 runs on that table; the
  result is the same as querying one segment at a time (and the tests check
  the table against bm25s.BM25.retrieve). Scores for a block of queries are a
  sparse-times-sparse product with the index's weight matrix; the few most
  frequent terms, which dominate that product's cost (their posting lists
  hold most segments), are scored with a dense matrix product instead.
  Top-k uses a threshold from a 1/8 sample of each row, then an exact sort
  of the few candidates above it; ties go to the lower segment index.
  Total work is still quadratic in the number of segments S (every query
  touches the posting lists of its terms); see docs/trime.md for timings.
* The random choices come from one permutation drawn with `seed` (a fallback
  takes the first unused segment in it), as in the authors' script, so the
  order is deterministic given the segments, k, seed and stop words.

The cached order of a token stream (``cached_bm25_order``) and the offline
command (``python -m memjax.methods.trime.bm25_order``, shardable over processes) are
in ``memjax.methods.trime.bm25_order``.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

try:
  from tqdm.auto import tqdm
except ImportError:  # pragma: no cover - tqdm is a dependency of bm25s
  tqdm = None

Segments = np.ndarray | Sequence[np.ndarray]

# Version of the packing result; part of the cache key.
_FORMAT_VERSION = 1
# Dense score block of one query chunk: about this many float32 entries.
_CHUNK_ENTRIES = 1 << 24


def _as_segment_list(segments: Segments) -> list[np.ndarray]:
  """[S, L] array or a sequence of 1-D arrays -> list of int64 arrays."""
  if isinstance(segments, np.ndarray):
    if segments.ndim != 2:
      raise ValueError(f"segments must be [S, L]; got shape {segments.shape}.")
    return [np.asarray(s, np.int64) for s in segments]
  out = [np.asarray(s, np.int64).reshape(-1) for s in segments]
  return out


def split_segments(tokens: np.ndarray, seq_len: int) -> list[np.ndarray]:
  """Cuts a token stream into segments: segment i is tokens[i*L:(i+1)*L].

  Args:
      tokens: [N] int token ids.
      seq_len: L.

  Returns:
      ceil(N / L) 1-D arrays; the last one may be shorter than L.
  """
  tokens = np.asarray(tokens).reshape(-1)
  if seq_len <= 0:
    raise ValueError(f"seq_len must be positive; got {seq_len}.")
  return [tokens[i : i + seq_len] for i in range(0, len(tokens), seq_len)]


class _Index:
  """BM25 weights of every (segment, term), split into dense and sparse terms.

  Attributes:
      num_segments: S.
      vocab: [V - 1] sorted distinct token ids of the (stop-word-free)
          corpus; term i is vocab[i] (term V - 1 never occurs).
      remapped: S int32 arrays, the segments as term indices.
      num_terms: V.
      dense_terms: [F] the most frequent terms (by document frequency).
      dense_weights: [F, S] float32 weights of those terms.
      sparse_weights: [V, S] CSR weights of the other terms (the rows of
          the dense terms are empty).
      is_dense: [V] bool.
      retriever: the bm25s.BM25 the weights come from.
  """

  def __init__(
      self,
      segments: list[np.ndarray],
      stopword_ids: Iterable[int] | None,
      dense_terms: int | None,
      k1: float,
      b: float,
      show_progress: bool,
  ):
    self.num_segments = len(segments)
    if stopword_ids is not None:
      stop = np.unique(np.asarray(list(stopword_ids), np.int64))
      segments = [s[~np.isin(s, stop)] for s in segments]
    flat = np.concatenate(segments) if segments else np.zeros(0, np.int64)
    self.vocab = np.unique(flat)
    # An extra never-occurring term so an all-stop-word corpus still indexes.
    remapped = [
        np.searchsorted(self.vocab, s).astype(np.int32) for s in segments
    ]
    num_terms = len(self.vocab) + 1
    self.remapped = remapped

    # Imported here: bm25s starts JAX's backends when it is imported, and
    # --mode=plan sets the devices JAX starts with after the methods load.
    import bm25s  # pylint: disable=g-import-not-at-top

    retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
    # The (ids, vocab) form: bm25s takes our ids as its term ids.
    vocab_dict = {i: i for i in range(num_terms)}
    retriever.index(
        (list(remapped), vocab_dict),
        create_empty_token=False,
        show_progress=show_progress,
    )
    scores = retriever.scores
    by_term = sp.csc_matrix(
        (scores["data"], scores["indices"], scores["indptr"]),
        shape=(self.num_segments, num_terms),
    ).T.tocsr()  # [V, S]
    by_term.sum_duplicates()
    doc_freq = np.diff(by_term.indptr)
    if dense_terms is None:
      # A sparse term costs ~df * (df / S) posting visits per query (only
      # queries that contain it), a dense one S multiply-adds in a
      # matrix product, ~100x cheaper each: dense pays off from df ~ S/10.
      # Measured on 50k Zipfian segments: 1/16 is near the optimum.
      dense_terms = int(np.sum(doc_freq * 16 >= max(self.num_segments, 1)))
    dense_terms = int(min(max(dense_terms, 0), num_terms))
    order = np.argsort(-doc_freq, kind="stable")
    self.dense_terms = np.sort(order[:dense_terms])
    self.is_dense = np.zeros(num_terms, bool)
    self.is_dense[self.dense_terms] = True
    self.dense_weights = np.asarray(
        by_term[self.dense_terms].toarray(), np.float32
    )
    keep = sp.diags((~self.is_dense).astype(np.float32))
    self.sparse_weights = (keep @ by_term).tocsr()
    self.sparse_weights.eliminate_zeros()
    self.num_terms = num_terms
    self.retriever = retriever

  def query_counts(self, rows: np.ndarray) -> sp.csr_matrix:
    """[len(rows), V] CSR bag-of-terms counts of the given segments."""
    docs = [self.remapped[r] for r in rows]
    lengths = np.array([len(d) for d in docs], np.int64)
    cols = np.concatenate(docs) if len(docs) else np.zeros(0, np.int32)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    counts = sp.csr_matrix(
        (np.ones(len(cols), np.float32), cols, indptr),
        shape=(len(rows), self.num_terms),
    )
    counts.sum_duplicates()
    return counts

  def scores(self, rows: np.ndarray) -> np.ndarray:
    """[len(rows), S] float32 BM25 scores of those segments as queries."""
    counts = self.query_counts(rows)
    num_rows, num_docs = len(rows), self.num_segments
    # Sparse terms: expand every (query, term) pair into the term's posting
    # list and sum with bincount (faster than scipy's sparse product,
    # whose output here is nearly dense).
    pair_rows = np.repeat(np.arange(num_rows), np.diff(counts.indptr))
    pair_terms, pair_counts = counts.indices, counts.data
    sparse = ~self.is_dense[pair_terms]
    pair_rows, pair_terms, pair_counts = (
        pair_rows[sparse],
        pair_terms[sparse],
        pair_counts[sparse],
    )
    postings = self.sparse_weights[pair_terms]  # one row per pair
    lengths = np.diff(postings.indptr)
    flat = np.repeat(pair_rows, lengths) * num_docs + postings.indices
    vals = postings.data * np.repeat(pair_counts, lengths)
    out = np.bincount(flat, weights=vals, minlength=num_rows * num_docs)
    out = out.reshape(num_rows, num_docs).astype(np.float32)
    if len(self.dense_terms):
      dense_q = np.asarray(counts[:, self.dense_terms].toarray(), np.float32)
      out += dense_q @ self.dense_weights
    return out


def _top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
  """Exact top-k per row (score descending, then index ascending).

  Args:
      scores: [R, S] float32.
      k: how many.

  Returns:
      [R, k] int64 column indices; -1 where fewer than k scores are > 0.
  """
  num_rows, num_cols = scores.shape
  out = np.full((num_rows, k), -1, np.int64)
  if num_cols == 0 or k == 0:
    return out
  k_eff = min(k, num_cols)
  # The k-th largest of a sample of a row is <= the row's k-th largest, so
  # every top-k entry is >= it; with a 1/8 sample about 8k entries are.
  stride = 8 if num_cols >= 64 * k_eff else 1
  sample = scores[:, ::stride]
  kk = min(k_eff, sample.shape[1])
  threshold = np.partition(sample, sample.shape[1] - kk, axis=1)[
      :, sample.shape[1] - kk
  ]
  threshold = np.maximum(
      threshold, np.finfo(np.float32).tiny
  )  # score 0: not a hit
  # Row-major: candidates come sorted by row, then column.
  cand_rows, cand_cols = np.nonzero(scores >= threshold[:, None])
  cand_scores = scores[cand_rows, cand_cols]
  # Two stable sorts: by score descending (columns stay ascending among
  # ties), then by row.
  order = np.argsort(-cand_scores, kind="stable")
  order = order[np.argsort(cand_rows[order], kind="stable")]
  cand_rows, cand_cols = cand_rows[order], cand_cols[order]
  starts = np.searchsorted(cand_rows, np.arange(num_rows))
  rank = np.arange(len(cand_rows)) - starts[cand_rows]
  keep = rank < k
  out[cand_rows[keep], rank[keep]] = cand_cols[keep]
  return out


def build_index(
    segments: Segments,
    *,
    stopword_ids: Iterable[int] | None = None,
    dense_terms: int | None = None,
    k1: float = 1.5,
    b: float = 0.75,
    show_progress: bool = True,
) -> _Index:
  """The BM25 index of the segments (see bm25_neighbours for the args)."""
  return _Index(
      _as_segment_list(segments),
      stopword_ids,
      dense_terms,
      k1,
      b,
      show_progress,
  )


def query_chunk(num_segments: int) -> int:
  """Queries scored per block: the [chunk, S] float32 block stays ~64 MB.

  Offline splits of the search cut at multiples of this, so every block is
  scored on the same rows as in one process and gives the same floats.
  """
  return int(min(max(_CHUNK_ENTRIES // max(num_segments, 1), 16), 4096))


def search_rows(
    index: _Index,
    queries: np.ndarray,
    k: int,
    *,
    chunk: int | None = None,
    show_progress: bool = False,
) -> np.ndarray:
  """[len(queries), k] int64 top-k hits of the given segments (-1 pads).

  Args:
      index: from build_index.
      queries: [Q] consecutive segment indices; when they start at a
          multiple of query_chunk(S) the blocks (and floats) are those of
          one process searching all S.
      k: hits per query.
      chunk: queries per scored block (None: query_chunk(S)).
      show_progress: a progress bar.
  """
  if k <= 0:
    raise ValueError(f"k must be positive; got {k}.")
  out = np.full((len(queries), k), -1, np.int64)
  chunk = chunk or query_chunk(index.num_segments)
  starts = range(0, len(queries), chunk)
  if show_progress and tqdm is not None:
    starts = tqdm(
        starts,
        desc="BM25 search",
        unit="chunk",
        total=-(-len(queries) // chunk),
    )
  for start in starts:
    rows = slice(start, min(start + chunk, len(queries)))
    out[rows] = _top_k_rows(index.scores(queries[rows]), k)
  return out


def bm25_neighbours(
    segments: Segments,
    k: int = 20,
    *,
    stopword_ids: Iterable[int] | None = None,
    dense_terms: int | None = None,
    k1: float = 1.5,
    b: float = 0.75,
    show_progress: bool = True,
    shard: tuple[int, int] | None = None,
) -> np.ndarray:
  """SimSeg(I, c, k) for every segment c: its top-k BM25 hits.

  Args:
      segments: [S, L] int array, or a sequence of S 1-D int arrays.
      k: hits per query (the query itself is usually the first).
      stopword_ids: token ids removed before indexing.
      dense_terms: how many of the most frequent terms to score with a
          dense matrix product (None: those in at least 1/16 of the
          segments). Only speed depends on it.
      k1: BM25 k1.
      b: BM25 b.
      show_progress: show progress bars.
      shard: optional (shard_id, num_shards): search only the queries of
          np.array_split(range(S), num_shards)[shard_id], so the search can
          be split over processes or machines; concatenating the shards'
          results in shard order gives the full table.

  Returns:
      [S, k] int64 segment indices (only the shard's rows with `shard`),
      best first; -1 pads rows with fewer than k hits (segments sharing no
      term with the query are not hits).
  """
  segs = _as_segment_list(segments)
  num = len(segs)
  if k <= 0:
    raise ValueError(f"k must be positive; got {k}.")
  queries = np.arange(num)
  if shard is not None:
    shard_id, num_shards = shard
    if not 0 <= shard_id < num_shards:
      raise ValueError(
          f"shard must be (shard_id, num_shards) with 0 <= shard_id < "
          f"num_shards; got {shard}."
      )
    queries = np.array_split(queries, num_shards)[shard_id]
  index = _Index(segs, stopword_ids, dense_terms, k1, b, show_progress)
  return search_rows(index, queries, k, show_progress=show_progress)


def pack_from_neighbours(
    neighbours: np.ndarray, seed: int = 0
) -> tuple[np.ndarray, int]:
  """Algorithm 1 given the precomputed SimSeg table.

  Args:
      neighbours: [S, k] int, each segment's hits best first (-1 = none).
      seed: seeds the random starts.

  Returns:
      (order, restarts): [S] int64 permutation of segment indices, and how
      many times the chain started from a random segment.
  """
  num = neighbours.shape[0]
  perm = np.random.default_rng(seed).permutation(num)
  used = np.zeros(num, bool)
  order = np.empty(num, np.int64)
  nbrs = neighbours.tolist()  # Python lists: this loop is scalar work
  p = 0
  c = -1
  restarts = 0
  for i in range(num):
    if c < 0:
      while used[perm[p]]:
        p += 1
      c = int(perm[p])
      restarts += 1
    order[i] = c
    used[c] = True
    nxt = -1
    for cand in nbrs[c]:
      if cand >= 0 and not used[cand]:
        nxt = cand
        break
    c = nxt
  return order, restarts


def bm25_pack(
    segments: Segments,
    batch_size: int,
    k: int = 20,
    seed: int = 0,
    show_progress: bool = True,
    *,
    stopword_ids: Iterable[int] | None = None,
    dense_terms: int | None = None,
) -> np.ndarray:
  """Orders segments so that consecutive groups of B are BM25 batches.

  Args:
      segments: [S, L] int32 token ids, or a sequence of 1-D arrays.
      batch_size: B. Algorithm 1's chain does not restart at batch
          boundaries, so the order does not depend on B.
      k: BM25 hits per query (20 in the paper).
      seed: seeds the random starts.
      show_progress: progress bars and a log line with counts.
      stopword_ids: token ids removed before indexing.
      dense_terms: see bm25_neighbours (speed only).

  Returns:
      [S] int64 permutation: batch j is order[j*B:(j+1)*B] (the last batch
      may be short).
  """
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive; got {batch_size}.")
  start = time.time()
  neighbours = bm25_neighbours(
      segments,
      k,
      stopword_ids=stopword_ids,
      dense_terms=dense_terms,
      show_progress=show_progress,
  )
  order, restarts = pack_from_neighbours(neighbours, seed)
  if show_progress:
    logging.info(
        "BM25 packing: %d segments, %d batches of %d, %d random restarts, %.1fs",
        len(order),
        -(-len(order) // batch_size),
        batch_size,
        restarts,
        time.time() - start,
    )
  return order
