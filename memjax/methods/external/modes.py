"""External memory modes: datastore, index and recall.

    python -m memjax.main --config=configs/trime_wt103.py:trime_ext_demo \
        --workdir=runs/trime_ext --mode=datastore   # (g, next token) shards
    ... --mode=index    # one ScaNN searcher per shard, serialised beside it
    ... --mode=recall   # ScaNN's recall@k against exact search (valid)
    ... --mode=tune     # eval_memory.kind = knn | trime_ext, on valid

The datastore lives in ``eval_memory.datastore`` (default
``<workdir>/datastore``); see ``memjax/memory/datastore.py`` for its layout
and ``docs/external_memory.md`` for the whole pipeline.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax import sharding as sharding_lib
from memjax.data import corpus as corpus_lib
from memjax.data import windows
from memjax.eval import external as external_lib
from memjax.io import paths
from memjax.memory import datastore as ds_lib
from memjax.memory import search as search_lib
from memjax.memory import shards
from memjax.run import restore
from memjax.run import spec


def _metric(run: spec.Run) -> str:
  """The metric of eval_memory.kind's external memory (inner product for a
  kind without one, TRIME's similarity)."""
  kind = run.parts.eval_memories.get(run.settings.eval_memory.kind)
  return kind.external_metric or "dot_product"


def _write_json(path: str, obj: Any) -> None:
  paths.write_json(path, obj)


def datastore(run: spec.Run) -> dict:
  """Builds this process's shards of the datastore (``--mode=datastore``)."""
  c, workdir = run.settings, run.workdir
  dc = c.of(settings_lib.Datastore)
  share = shards.process_share(dc.process_index, dc.process_count, "datastore")
  split, other = dc.split, dc.corpus
  loaded, tokens = _datastore_tokens(run, dc)
  dp = sharding_lib.data_parallel(loaded.mesh)
  bs = int(dc.batch_size or c.eval_memory.batch_size)
  bs = -(-bs // dp) * dp
  scoring = loaded.scoring()
  build = ds_lib.BuildSpec(
      signature=scoring.signature,
      checkpoint=external_lib.datastore_checkpoint(scoring),
      dim=int(loaded.model.cfg.d_model),
      corpus=other or c.data.corpus,
      split=split,
      window_len=int(c.eval.window_len),
      score_len=int(c.eval.score_len),
      batch_size=bs,
      shard_batches=max(1, int(dc.shard_keys) // (bs * c.eval.score_len)),
      num_tokens=int(len(tokens)),
      window_bos=scoring.window_bos,
  )
  path = external_lib.datastore_path(scoring, workdir)
  ds_lib.check_build_dir(path, build)
  start = time.time()
  store = ds_lib.build(
      loaded.model,
      loaded.variables,
      tokens,
      build,
      path,
      mesh=loaded.mesh,
      process_index=share[0],
      process_count=share[1],
  )
  elapsed = time.time() - start
  out = {"mode": "datastore", "path": path, "seconds": elapsed}
  if store is None:
    return {**out, "summary_lines": [f"datastore: shards written in {path}"]}
  disk = sum(
      paths.getsize(paths.join(path, f))
      for f in paths.listdir(path)
      if f.startswith("shard-")
  )
  out.update(
      keys=store.count,
      dim=store.dim,
      bytes=disk,
      bytes_per_key=disk / max(store.count, 1),
  )
  return {
      **out,
      "results_path": paths.join(path, "manifest.json"),
      "summary_lines": [
          f"datastore {path}: {store.count} keys x {store.dim} "
          f"({disk / 2**20:.1f} MiB, {disk / max(store.count, 1):.0f} "
          f"bytes/key) in {len(store.keys)} shards, {elapsed:.1f}s"
      ],
  }


def _datastore_tokens(
    run: spec.Run, dc: settings_lib.Datastore
) -> tuple[restore.Restored, np.ndarray]:
  """The restored run and the windows of tokens ``--mode=datastore`` reads.

  Returns:
    (the run restored with the split it reads, the tokens [N] int32: whole
    windows, at most ``datastore.max_windows`` of them).
  """
  c = run.settings
  if dc.split not in ("train", "valid", "test"):
    raise errors.ConfigError(
        f"datastore.split must be train, valid or test, got {dc.split!r}"
    )
  split, other = dc.split, dc.corpus
  if other:  # another corpus, read with the run's vocabulary (Table 5)
    tokens = corpus_lib.read_stream(
        c.data, c.eval, run.workdir, split, other, dc.data_dir
    ).tokens
    loaded = restore.load_splits(run, splits=())
  else:
    loaded = restore.load_splits(
        run,
        splits=() if split == "train" else (split,),
        train=split == "train",
    )
    tokens = loaded.train_tokens if split == "train" else loaded.splits[split]
  tokens = windows.truncate_windows(
      np.asarray(tokens),
      c.eval.window_len,
      c.eval.score_len,
      int(dc.max_windows),
  )
  return loaded, tokens


def _load_store(
    run: spec.Run, splits: Sequence[str] = ()
) -> tuple[restore.Restored, ds_lib.Datastore]:
  loaded = restore.load_splits(run, splits=tuple(splits))
  scoring = loaded.scoring()
  store = ds_lib.open_datastore(
      external_lib.datastore_path(scoring, run.workdir),
      signature=scoring.signature,
      dim=loaded.model.cfg.d_model,
      checkpoint=external_lib.datastore_checkpoint(scoring),
      window_bos=scoring.window_bos,
  )
  return loaded, store


def index(run: spec.Run) -> dict:
  """Builds and serialises the ScaNN index of the datastore
  (``--mode=index``)."""
  _, store = _load_store(run)
  em, dc = run.settings.eval_memory, run.settings.of(settings_lib.Datastore)
  k = int(em.ext_k)
  search_lib.check_k(store, k)
  metric = _metric(run)
  start = time.time()
  search_lib.build_index(
      store,
      metric,
      k,
      leaves=int(dc.leaves),
      leaves_to_search=int(em.leaves_to_search),
      reorder=int(dc.reorder),
  )
  elapsed = time.time() - start
  return {
      "mode": "index",
      "metric": metric,
      "seconds": elapsed,
      "results_path": search_lib.index_dir(store.path, metric),
      "summary_lines": [
          f"index ({metric}) of {store.count} keys in {len(store.keys)} "
          f"shards: {elapsed:.1f}s, in "
          f"{search_lib.index_dir(store.path, metric)}"
      ],
  }


def held_out_queries(
    loaded: restore.Restored, split: str, count: int, with_targets: bool = False
) -> Any:
  """g of the first ``count`` scored predictions of ``split`` [Q, D] (and
  their next tokens [Q] with ``with_targets``)."""
  c = loaded.settings
  fn = sharding_lib.jit(
      ds_lib.make_feature_fn(loaded.model, c.eval.score_len), loaded.mesh
  )
  dp = sharding_lib.data_parallel(loaded.mesh)
  out, targets, have = [], [], 0
  for batch in windows.memory_eval_batches(
      loaded.splits[split],
      c.eval.window_len,
      c.eval.score_len,
      -(-int(c.eval_memory.batch_size) // dp) * dp,
      loaded.scoring().window_bos,
  ):
    g, tgt, pos = jax.device_get(
        fn(loaded.variables, sharding_lib.put_global_batch(batch, loaded.mesh))
    )
    ok = pos.reshape(-1) >= 0
    out.append(g.reshape(-1, g.shape[-1])[ok].astype(np.float32))
    targets.append(tgt.reshape(-1)[ok])
    have += int(ok.sum())
    if have >= count:
      break
  if with_targets:
    return np.concatenate(out)[:count], np.concatenate(targets)[:count]
  return np.concatenate(out)[:count]


def retrieval_accuracy(
    store: ds_lib.Datastore,
    idx: np.ndarray,
    targets: np.ndarray,
    ks=(1, 8, 64, 1024),
) -> dict[str, float]:
  """Table 13: share of queries with their next token among the values of
  their top-K neighbours, per K (<= the neighbours found)."""
  _, values = store.gather(idx)
  hit = (values == targets[:, None]) & (idx >= 0)
  first = np.where(hit.any(1), hit.argmax(1), idx.shape[1])
  return {str(k): float(np.mean(first < k)) for k in ks if k <= idx.shape[1]}


def recall_curve(
    scann: search_lib.ScannSearcher,
    queries: np.ndarray,
    exact_idx: np.ndarray,
    k: int,
    leaves: Sequence[int],
) -> list[dict[str, float]]:
  """ScaNN's recall@k against ``exact_idx`` [Q, k] and its time per query
  for each number of leaves searched (``scann``'s loaded searchers, each
  number set at search time).

  Args:
    scann: the loaded index.
    queries: [Q, D] float32.
    exact_idx: [Q, k] the exact neighbours' indices.
    k: neighbours per query.
    leaves: the numbers of leaves searched.
  """
  rows = []
  for n in leaves:
    searcher = search_lib.ScannSearcher(
        scann.store, scann.metric, scann.searchers, int(n), scann.reorder
    )
    searcher.search(queries[:8], k)  # warms up
    (_, found), seconds = search_lib.timed(searcher.search, queries, k)
    rows.append(
        {
            "leaves_to_search": int(n),
            "recall": search_lib.recall_at_k(found, exact_idx),
            "ms_per_query": 1000 * seconds / max(len(queries), 1),
        }
    )
  return rows


def neighbour_examples(
    store: ds_lib.Datastore,
    tokens: np.ndarray,
    scores: np.ndarray,
    idx: np.ndarray,
    count: int,
    context: int = 12,
    shown: int = 8,
) -> list[dict[str, Any]]:
  """What exact search retrieves for ``count`` queries spread evenly over
  the Q held-out queries (query i is the prediction of ``tokens[i + 1]``
  after ``tokens[: i + 1]``).

  Args:
    store: the datastore searched.
    tokens: [N] the queries' split.
    scores: [Q, k] exact scores of the neighbours, best first.
    idx: [Q, k] their indices in the datastore (-1: none).
    count: the queries shown.
    context: the tokens of context shown, the query's last.
    shown: the neighbours shown per query (at most k).

  Returns:
    Per query: {'position': i, 'context': the last ``context`` token ids,
    'next': the true next token id, 'scores': [shown] float, 'tokens':
    [shown] the neighbours' next-token ids}.
  """
  rows = [(j + 1) * len(idx) // (count + 1) for j in range(count)]
  _, values = store.gather(idx[rows, :shown])  # only the queries shown
  out = []
  for j, i in enumerate(rows):
    ok = idx[i, :shown] >= 0
    out.append(
        {
            "position": int(i),
            "context": [
                int(t) for t in tokens[max(i + 1 - context, 0) : i + 1]
            ],
            "next": int(tokens[i + 1]),
            "scores": [float(x) for x in scores[i, :shown][ok]],
            "tokens": [int(v) for v in values[j][ok]],
        }
    )
  return out


def recall(run: spec.Run) -> dict:
  """recall@k of the ScaNN index against exact search on valid queries
  (``--mode=recall``) -> ``recall.json``; with ``datastore.recall_leaves``
  also the recall and time per query of each number of leaves searched
  ('curve'), with ``datastore.recall_examples`` the neighbours of that many
  queries ('examples', token ids)."""
  loaded, store = _load_store(run, splits=("valid",))
  em, dc = run.settings.eval_memory, run.settings.of(settings_lib.Datastore)
  k = int(em.ext_k)
  search_lib.check_k(store, k)
  metric = _metric(run)
  reorder = int(em.reorder_candidates)
  scann = search_lib.load_index(
      store, metric, int(em.leaves_to_search), reorder
  )
  queries, targets = held_out_queries(
      loaded, "valid", int(dc.recall_queries), True
  )
  exact = search_lib.ExactSearcher(store, metric)
  exact.search(queries[:8], k)  # compiles the program every chunk runs
  scann.search(queries[:8], k)
  (e_scores, e_idx), t_exact = search_lib.timed(exact.search, queries, k)
  (_, a_idx), t_scann = search_lib.timed(scann.search, queries, k)
  r = search_lib.recall_at_k(a_idx, e_idx)
  res = {
      "mode": "recall",
      "metric": metric,
      "k": k,
      "keys": store.count,
      "queries": int(len(queries)),
      "recall": r,
      "exact_queries_per_s": len(queries) / t_exact,
      "scann_queries_per_s": len(queries) / t_scann,
      "speedup": t_exact / t_scann,
      # Table 13, with exact search.
      "retrieval_accuracy": retrieval_accuracy(store, e_idx, targets),
      "curve": recall_curve(scann, queries, e_idx, k, tuple(dc.recall_leaves)),
      "examples": neighbour_examples(
          store,
          np.asarray(loaded.splits["valid"]),
          e_scores,
          e_idx,
          int(dc.recall_examples),
      ),
  }
  path = paths.join(run.workdir, "recall.json")
  _write_json(path, res)
  lines = [
      f"ScaNN recall@{k} against exact search: {r:.4f} on {len(queries)} "
      f"valid queries, {store.count} keys; {res['scann_queries_per_s']:.0f}"
      f" vs {res['exact_queries_per_s']:.0f} queries/s "
      f"({res['speedup']:.1f}x)",
      "top-K retrieval accuracy (next token among the neighbours'): "
      + ", ".join(
          f"K={k}: {a:.3f}" for k, a in res["retrieval_accuracy"].items()
      ),
  ]
  lines += [
      f"  {p['leaves_to_search']} leaves searched: recall@{k} "
      f"{p['recall']:.4f}, {p['ms_per_query']:.3f} ms/query"
      for p in res["curve"]
  ]
  return {**res, "results_path": path, "summary_lines": lines}
