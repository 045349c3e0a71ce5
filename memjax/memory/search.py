"""Nearest-neighbour search over a datastore: exact (JAX) and ScaNN.

Scores are "larger is closer" for both metrics: the inner product g . k
('dot_product', TRIME's training similarity) or minus the squared L2
distance ('squared_l2', kNN-LM). Every searcher returns, per query, the
top-k global datastore indices and their scores, merged across shards.

* ``exact_topk``: blockwise over the keys in JAX (a running top-k, one
  [Q, block] score tile at a time), the yardstick.
* ScaNN (``scann_ops_pybind``; one searcher per shard, since ScaNN has no
  sharding API): a k-means tree with about sqrt(n) leaves, asymmetric
  hashing (anisotropic for inner product), and exact re-ordering of the top
  candidates against the shard's float32 keys, so the returned scores are
  exact. Indices are serialised into ``<datastore>/index/`` with
  ``index.json`` naming the datastore they belong to, and reloaded without
  rebuilding.
"""

from __future__ import annotations

import functools
import math
import time
import uuid
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax.io import console
from memjax import errors
from memjax.io import paths
from memjax.memory import datastore as ds_lib
from memjax.memory import shards

METRICS = ("dot_product", "squared_l2")


def check_metric(metric: str) -> None:
  if metric not in METRICS:
    raise errors.ConfigError(f"metric must be one of {METRICS}, got {metric!r}")


@functools.partial(jax.jit, static_argnames=("k", "metric", "block"))
def _exact_block_topk(queries, keys, valid, k: int, metric: str, block: int):
  """Running top-k over key blocks; keys [n_blocks * block, D]."""
  q = queries.astype(jnp.float32)
  qn = jnp.sum(q * q, -1, keepdims=True)
  kb = keys.reshape(-1, block, keys.shape[-1])
  vb = valid.reshape(-1, block)
  init = (
      jnp.full((q.shape[0], k), -jnp.inf, jnp.float32),
      jnp.full((q.shape[0], k), -1, jnp.int32),
  )

  def body(carry, x):
    best_s, best_i = carry
    i, kblk, vblk = x
    kblk = kblk.astype(jnp.float32)
    s = jnp.einsum("qd,kd->qk", q, kblk, precision="highest")
    if metric == "squared_l2":
      s = -(qn - 2.0 * s + jnp.sum(kblk * kblk, -1)[None, :])
    s = jnp.where(vblk[None, :], s, -jnp.inf)
    idx = i * block + jnp.arange(block, dtype=jnp.int32)
    all_s = jnp.concatenate([best_s, s], axis=1)
    all_i = jnp.concatenate([best_i, jnp.broadcast_to(idx, s.shape)], axis=1)
    top_s, pos = jax.lax.top_k(all_s, k)
    return (top_s, jnp.take_along_axis(all_i, pos, axis=1)), None

  (s, i), _ = jax.lax.scan(
      body, init, (jnp.arange(kb.shape[0], dtype=jnp.int32), kb, vb)
  )
  return s, jnp.where(jnp.isfinite(s), i, -1)


def exact_topk(
    queries: np.ndarray,
    keys: np.ndarray,
    k: int,
    metric: str,
    block: int = 16384,
    query_block: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
  """Exact top-k of ``queries`` [Q, D] over ``keys`` [N, D].

  Queries go in padded chunks of ``query_block``, so any Q runs the one
  compiled program of (query_block, N, k).

  Returns:
    (scores [Q, k] float32 descending, indices [Q, k] int32); -inf / -1
    where N < k.
  """
  check_metric(metric)
  n = keys.shape[0]
  block = max(1, min(block, n))
  pad = (-n) % block
  if pad:
    keys = jnp.concatenate(
        [jnp.asarray(keys), jnp.zeros((pad, keys.shape[1]), keys.dtype)]
    )
  valid = jnp.arange(n + pad) < n
  keys = jnp.asarray(keys)
  q = np.asarray(queries, np.float32)
  qb = max(1, query_block)
  out_s, out_i = [], []
  for a in range(0, q.shape[0], qb):
    chunk = q[a : a + qb]
    m = chunk.shape[0]
    if m < qb:
      chunk = np.concatenate([chunk, np.zeros((qb - m, q.shape[1]), q.dtype)])
    s, i = _exact_block_topk(
        jnp.asarray(chunk), keys, valid, k=int(k), metric=metric, block=block
    )
    out_s.append(np.asarray(s)[:m])
    out_i.append(np.asarray(i)[:m])
  if not out_s:
    return np.zeros((0, k), np.float32), np.zeros((0, k), np.int32)
  return np.concatenate(out_s), np.concatenate(out_i)


def merge_topk(
    scores: Sequence[np.ndarray], indices: Sequence[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
  """Merges per-shard top-k lists ([Q, k_s] each, global indices)."""
  s = np.concatenate(scores, axis=1)
  i = np.concatenate(indices, axis=1)
  order = np.argsort(-s, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)


def recall_at_k(approx: np.ndarray, exact: np.ndarray) -> float:
  """Mean share of each query's exact top-k (indices [Q, k]) found."""
  hits = [
      len(np.intersect1d(a[a >= 0], e[e >= 0])) / max(int((e >= 0).sum()), 1)
      for a, e in zip(approx, exact)
  ]
  return float(np.mean(hits)) if hits else 1.0


class ExactSearcher:
  """Exact search over a datastore, shard by shard (keys kept on device)."""

  name = "exact"

  def __init__(self, store: ds_lib.Datastore, metric: str):
    check_metric(metric)
    self.store, self.metric = store, metric
    self._keys = [jnp.asarray(np.asarray(k)) for k in store.keys]

  def search(self, queries: np.ndarray, k: int):
    """(scores [Q, k], global indices [Q, k])."""
    out_s, out_i = [], []
    for off, keys in zip(self.store.offsets, self._keys):
      if keys.shape[0] == 0:
        continue
      s, i = exact_topk(queries, keys, min(k, keys.shape[0]), self.metric)
      out_s.append(s)
      out_i.append(np.where(i >= 0, i + off, -1))
    if not out_s:
      q = queries.shape[0]
      return np.zeros((q, 0), np.float32), np.zeros((q, 0), np.int32)
    return merge_topk(out_s, out_i, k)


def _scann():
  """ScaNN's pybind module (the ``[retrieval]`` extra), imported lazily.

  The scann package's ``__init__`` imports TensorFlow when it is installed:
  the accelerators are hidden from it first (``optional.tensorflow``).
  """
  from memjax.io import optional  # pylint: disable=g-import-not-at-top

  try:
    optional.tensorflow("ScaNN")
  except errors.MissingDependencyError:
    pass  # ScaNN's index runs without TensorFlow.
  return optional.require(
      "scann.scann_ops.py.scann_ops_pybind", "a ScaNN datastore index"
  )


def default_leaves(n: int) -> int:
  return max(1, int(round(math.sqrt(n))))


def build_shard_index(
    keys: np.ndarray,
    metric: str,
    k: int,
    *,
    leaves: int = 0,
    leaves_to_search: int = 0,
    reorder: int = 0,
    training_sample: int = 100_000,
) -> Any:
  """A ScaNN searcher over one shard's keys [n, D] (float32 copy kept for
  exact re-ordering of ``reorder`` candidates, 0: max(2k, 256); -1: no
  re-ordering, the quantised scores are returned)."""
  check_metric(metric)
  x = np.ascontiguousarray(np.asarray(keys, np.float32))
  n = x.shape[0]
  k = min(k, n)
  b = _scann().builder(x, k, metric)
  if n >= 2 * 64:
    leaves = min(leaves or default_leaves(n), n // 2)
    b = b.tree(
        num_leaves=leaves,
        num_leaves_to_search=min(
            leaves, leaves_to_search or max(1, leaves // 10)
        ),
        training_sample_size=min(n, training_sample),
    )
  if n >= 256:
    b = (
        b.score_ah(2, anisotropic_quantization_threshold=0.2)
        if metric == "dot_product"
        else b.score_ah(2)
    )
    if reorder >= 0:
      b = b.reorder(min(n, reorder or max(2 * k, 256)))
  else:
    b = b.score_brute_force()
  return b.build()


class ScannSearcher:
  """One ScaNN searcher per shard; top-k merged across shards."""

  name = "scann"

  def __init__(
      self,
      store: ds_lib.Datastore,
      metric: str,
      searchers: list[Any],
      leaves_to_search: int = 0,
      reorder: int = 0,
  ):
    self.store, self.metric, self.searchers = store, metric, searchers
    self.leaves_to_search = leaves_to_search
    self.reorder = reorder

  def search(self, queries: np.ndarray, k: int):
    """(scores [Q, k], global indices [Q, k]); exact scores of the found
    unless the index was built without re-ordering (quantised scores)."""
    q = np.ascontiguousarray(queries, np.float32)
    out_s, out_i = [], []
    for off, keys, srch in zip(
        self.store.offsets, self.store.keys, self.searchers
    ):
      if srch is None:
        continue
      kk = min(k, keys.shape[0])
      idx, dist = srch.search_batched_parallel(
          q,
          final_num_neighbors=kk,
          pre_reorder_num_neighbors=max(self.reorder or 2 * kk, kk, 256),
          leaves_to_search=self.leaves_to_search or None,
      )
      idx = np.asarray(idx, np.int64)
      dist = np.asarray(dist, np.float32)
      if self.metric == "squared_l2":
        dist = -dist
      ok = idx >= 0
      out_s.append(np.where(ok, dist, -np.inf))
      out_i.append(np.where(ok, idx + off, -1))
    if not out_s:
      n = q.shape[0]
      return np.zeros((n, 0), np.float32), np.zeros((n, 0), np.int32)
    return merge_topk(out_s, out_i, k)


def index_dir(store_path: str, metric: str) -> str:
  return paths.join(store_path, f"index-{metric}")


def build_index(
    store: ds_lib.Datastore,
    metric: str,
    k: int,
    *,
    leaves: int = 0,
    leaves_to_search: int = 0,
    reorder: int = 0,
) -> ScannSearcher:
  """Builds and serialises one ScaNN searcher per shard beside the store."""
  out = index_dir(store.path, metric)
  paths.makedirs(out)
  searchers, meta = [], []
  start = time.time()
  for s, keys in enumerate(store.keys):
    n = int(keys.shape[0])
    if n == 0:
      searchers.append(None)
      meta.append({"count": 0})
      continue
    srch = build_shard_index(
        keys,
        metric,
        k,
        leaves=leaves,
        leaves_to_search=leaves_to_search,
        reorder=reorder,
    )
    d = paths.join(out, shards.shard_name(s))
    # ScaNN writes local files: built locally, uploaded for a URL.
    with paths.local_dir(d, "w") as local:
      srch.serialize(local, relative_path=True)  # the datastore may move
    searchers.append(srch)
    meta.append({"count": n, "leaves": min(leaves or default_leaves(n), n)})
    console.info(
        "index: shard %d/%d (%d keys) built, %.0fs",
        s + 1,
        len(store.keys),
        n,
        time.time() - start,
    )
  paths.write_json(
      paths.join(out, "index.json"),
      {
          "datastore_id": store.manifest["id"],
          "id": uuid.uuid4().hex,  # this build (``index_id``)
          "metric": metric,
          "k": int(k),
          "reorder": int(reorder),
          "shards": meta,
      },
      sort_keys=False,
  )
  return ScannSearcher(store, metric, searchers, leaves_to_search)


def index_id(store: ds_lib.Datastore, metric: str) -> str:
  """The id of the ``metric`` index's latest build ('' for none, or an
  index written before builds had ids): a searcher loaded from an older
  build is stale."""
  ipath = paths.join(index_dir(store.path, metric), "index.json")
  return (
      str(paths.read_json(ipath).get("id", "")) if paths.exists(ipath) else ""
  )


def load_index(
    store: ds_lib.Datastore,
    metric: str,
    leaves_to_search: int = 0,
    reorder: int = 0,
) -> ScannSearcher:
  """Reloads the serialised ScaNN searchers of ``store`` (no rebuilding).

  Raises:
    errors.MissingRunError: no index for this metric.
    errors.DataError: the index belongs to another datastore.
  """
  out = index_dir(store.path, metric)
  ipath = paths.join(out, "index.json")
  if not paths.exists(ipath):
    raise errors.MissingRunError(
        f"no {metric} ScaNN index in {store.path}; build it with --mode=index"
    )
  meta = paths.read_json(ipath)
  counts = [len(v) for v in store.values]
  if (
      meta.get("datastore_id") != store.manifest.get("id")
      or [s["count"] for s in meta["shards"]] != counts
  ):
    raise errors.DataError(
        f"the index in {out} does not match its datastore (rebuilt since?): "
        "rebuild it with --mode=index"
    )
  searchers = []
  for s, n in enumerate(counts):
    d = paths.join(out, shards.shard_name(s))
    if not n:
      searchers.append(None)
      continue
    with paths.local_dir(d, "r") as local:  # ScaNN reads local files.
      searchers.append(_scann().load_searcher(local))
  return ScannSearcher(store, metric, searchers, leaves_to_search, reorder)


def make_searcher(
    store: ds_lib.Datastore,
    metric: str,
    method: str,
    leaves_to_search: int = 0,
    reorder: int = 0,
) -> Any:
  """'exact' or 'scann' (the serialised index; ``reorder`` candidates
  re-ordered exactly per query, 0: max(2k, 256))."""
  if method == "exact":
    return ExactSearcher(store, metric)
  if method == "scann":
    return load_index(store, metric, leaves_to_search, reorder)
  raise errors.ConfigError(
      f"eval_memory.search must be 'scann' or 'exact', got {method!r}"
  )


def check_k(store: ds_lib.Datastore, k: int) -> None:
  if k < 1 or k > store.count:
    raise errors.ConfigError(
        f"eval_memory.ext_k={k} must be in [1, {store.count}] (the "
        f"datastore at {store.path} holds {store.count} keys)"
    )


def exact_scores(
    store: ds_lib.Datastore,
    queries: np.ndarray,
    idx: np.ndarray,
    metric: str,
    chunk: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
  """Scores recomputed from the stored keys, and the neighbours' values.

  Args:
    store: the datastore.
    queries: [Q, D] float.
    idx: [Q, K] global indices (-1: none).
    metric: as the searcher's.
    chunk: queries per gather.

  Returns:
    (scores [Q, K] float32, -inf where idx < 0; values [Q, K] int32).
  """
  q = np.asarray(queries, np.float32)
  scores = np.full(idx.shape, -np.inf, np.float32)
  values = np.zeros(idx.shape, np.int32)
  for a in range(0, q.shape[0], chunk):
    keys, vals = store.gather(idx[a : a + chunk])
    qc = q[a : a + chunk]
    if metric == "dot_product":
      s = np.einsum("qd,qkd->qk", qc, keys)
    else:
      s = -np.sum((keys - qc[:, None, :]) ** 2, axis=-1)
    ok = idx[a : a + chunk] >= 0
    scores[a : a + chunk] = np.where(ok, s, -np.inf)
    values[a : a + chunk] = vals
  return scores, values


def timed(fn, *args) -> tuple[Any, float]:
  start = time.perf_counter()
  out = fn(*args)
  return out, time.perf_counter() - start


def searcher_label(searcher: Optional[Any]) -> str:
  return getattr(searcher, "name", "none")
