"""Scoring with an external memory: the host's search between two jitted steps.

An evaluation memory kind with an ``external_metric`` (kNN-LM, TRIMELM_ext;
``memjax/methods/external/memories.py``) reads the K nearest (g, next
token) pairs of a datastore (``memjax/memory/datastore.py``), searched on
the host (``memjax/memory/search.py``) with the neighbours' scores
recomputed from the stored keys. The accelerator computes a batch's
features and its local/long sums (``memory_grid.make_eval_step``); the host
searches the datastore; a second jitted function adds the external sums and
lets the kind combine them. With ``pipeline`` the host searches batch t in
a worker thread while batch t + 1's forward pass runs; the results equal
the sequential ones.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from memjax.io import console
from memjax.io import paths
from memjax import sharding as sharding_lib
from memjax.data import windows
from memjax.memory import blockwise
from memjax.memory import datastore as ds_lib
from memjax.memory import evaluation
from memjax.memory import search as search_lib

Array = jax.Array


def external_sums(
    scores: Array, values: Array, targets: Array, scales: Array
) -> tuple[Array, Array]:
  """(lse_all, lse_pos) [G, ...] over the neighbours.

  Args:
    scores: [..., K] float32 neighbour scores (g . g_j, or -||g - g_j||^2),
      -inf for none.
    values: [..., K] int their next tokens.
    targets: [...] int.
    scales: [G] float32.
  """
  if scores.shape[-1] == 0:  # an empty external memory
    empty = jnp.full((scales.shape[0],) + targets.shape, -jnp.inf, jnp.float32)
    return empty, empty
  valid = jnp.isfinite(scores)
  pos = valid & (values == targets[..., None])

  def one(scale):
    s = jnp.where(valid, scores, 0.0) * scale
    return blockwise.masked_logsumexp(s, valid), blockwise.masked_logsumexp(
        s, pos
    )

  return jax.vmap(one)(scales)


def make_combine_fn(memory: evaluation.EvalMemory, settings, dim: int):
  """``fn(out, scores [W, S, K], values [W, S, K]) -> [points, W, S]`` log p
  of every setting, padding rows 0."""
  scales = jnp.asarray(memory.scales(settings, dim), jnp.float32)

  def fn(out, scores, values):
    e_all, e_pos = external_sums(scores, values, out["targets"], scales)
    if memory.reads_local and memory.joins_local:
      sums = [
          (blockwise.logaddexp(s[0], e_all), blockwise.logaddexp(s[1], e_pos))
          for s in out["sums"]
      ]
    elif memory.reads_local:
      sums = [(s[0], s[1], e_all, e_pos) for s in out["sums"]]
    else:
      sums = [(e_all, e_pos)]
    logp = memory.combine(settings, out["lm"], out["log_z"], sums)
    w = out["weights"]
    logp = logp.reshape((-1,) + w.shape)
    return jnp.where(w > 0, logp, 0.0)

  return fn


@dataclasses.dataclass
class ExternalSearch:
  """How an evaluation reaches its external memory.

  Attributes:
    searcher: a ``search.ExactSearcher`` or ``search.ScannSearcher`` (None:
      an empty external memory).
    k: neighbours per query.
    pipeline: search batch t in a thread while t + 1 runs forward.
    rescore: recompute the scores from the stored keys; False: the
      searcher's scores as returned (``eval_memory.rescore``).
    search_seconds, queries: the time spent searching and the queries
      searched so far.
  """

  searcher: Any
  k: int
  pipeline: bool = True
  search_seconds: float = 0.0
  rescore: bool = True
  queries: int = 0

  def neighbours(self, queries: np.ndarray):
    """(scores [Q, K], values [Q, K]): recomputed from the stored keys, or
    as the searcher returned them (``rescore``)."""
    start = time.perf_counter()
    if self.searcher is None or self.k == 0:
      q = queries.shape[0]
      empty = np.zeros((q, 0))
      return empty.astype(np.float32), empty.astype(np.int32)
    found, idx = self.searcher.search(queries, self.k)
    if self.rescore:
      scores, values = search_lib.exact_scores(
          self.searcher.store, queries, idx, self.searcher.metric
      )
    else:
      scores = np.where(idx >= 0, found, -np.inf).astype(np.float32)
      values = self.searcher.store.gather_values(idx)
    self.search_seconds += time.perf_counter() - start
    self.queries += int(queries.shape[0])
    return scores, values


def run_stream(
    scorer: Any,
    step: Any,
    params: Any,
    tokens: np.ndarray,
    *,
    keep_tokens: bool,
    desc: str,
) -> tuple[list[dict[str, Any]], float]:
  """Scores a stream with an external memory: the per-batch sums of
  ``memory_grid.MemoryScorer.score_grid`` for its grid's kind and
  settings, and the start time.

  Args:
    scorer: the ``memory_grid.MemoryScorer`` (its model, mesh, windows,
      batch size, grid, external memory, and the jitted functions it keeps
      between calls).
    step: its evaluation step (``memory_step.make_eval_step``).
    params: the parameters.
    tokens: [N] the token stream.
    keep_tokens: also keep per-prediction log-probabilities.
    desc: name for the progress lines.
  """
  model, mesh, external = scorer.model, scorer.mesh, scorer.external
  key = ("external", id(step))  # step is kept alive by the scorer's entry
  if key not in scorer.compiled:
    memory, settings = scorer.grid.memory, scorer.grid.values()
    scorer.compiled[key] = (
        sharding_lib.jit(step, mesh, donate_argnums=(1,)),
        jax.jit(make_combine_fn(memory, settings, model.cfg.d_model)),
    )
  dev, combine = scorer.compiled[key]

  def finish(out, fut) -> dict[str, Any]:
    scores, values = fut.result() if hasattr(fut, "result") else fut
    return _batch_sums(combine, out, scores, values, keep_tokens)

  def host_search(out):
    q = np.asarray(out["queries"])
    return external.neighbours(q.reshape(-1, q.shape[-1]))

  bank = evaluation.init_bank(step.capacity, model.cfg.d_model)
  pool = concurrent.futures.ThreadPoolExecutor(1)
  start, last = time.time(), time.time()
  fetched, prev = [], None
  batches = windows.memory_eval_batches(
      tokens,
      scorer.window_len,
      scorer.score_len,
      scorer.batch_size,
      scorer.scoring.window_bos,
  )
  try:
    for i, batch in enumerate(batches):
      bank, out = dev(params, bank, sharding_lib.put_global_batch(batch, mesh))
      if prev is not None:
        fetched.append(finish(*prev))
      fut = (
          pool.submit(host_search, out)
          if external.pipeline
          else host_search(out)
      )
      prev = (out, fut)
      if time.time() - last > 30:
        last = time.time()
        console.info(
            "%s: batch %d, %.0fs (%.0fs searching)",
            desc,
            i + 1,
            last - start,
            external.search_seconds,
        )
    if prev is not None:
      fetched.append(finish(*prev))
  finally:
    pool.shutdown()
  return fetched, start


def _batch_sums(
    combine: Any,
    out: dict[str, Any],
    scores: np.ndarray,
    values: np.ndarray,
    keep_tokens: bool,
) -> dict[str, Any]:
  """A batch's sums (host arrays) once its neighbours ([Q, K] scores and
  values of its W * S queries) are known."""
  shape = out["targets"].shape
  logp = combine(
      out,
      jnp.asarray(scores.reshape(shape + (-1,))),
      jnp.asarray(values.reshape(shape + (-1,))),
  )
  w = out["weights"]
  res = {
      "lm": -jnp.sum(out["lm"] * w),
      "tokens": jnp.sum(w),
      "grid": -jnp.sum(logp * w, axis=(1, 2)),
  }
  if keep_tokens:
    res.update(
        grid_tok=logp,
        lm_tok=out["lm"],
        w_tok=w,
        tgt_tok=out["targets"],
        pos_tok=out["positions"],
    )
  return jax.device_get(res)


_SEARCHERS: dict[tuple[Any, ...], Any] = {}


def datastore_path(scoring: Any, workdir: str) -> str:
  """``eval_memory.datastore``, else ``<workdir>/datastore`` (or
  ``datastore-<corpus>`` for one built from ``datastore.corpus``)."""
  if scoring.memory.datastore:
    return scoring.memory.datastore
  other = scoring.datastore_corpus
  return paths.join(workdir, f"datastore-{other}" if other else "datastore")


def datastore_checkpoint(scoring: Any) -> dict[str, Any]:
  """Which parameters a datastore's keys come from (the path and step of
  the restored run the scoring describes)."""
  return {"source": paths.realpath(scoring.path), "step": int(scoring.step)}


def external_search(scoring: Any, metric: str, workdir: str) -> ExternalSearch:
  """The datastore and searcher of the scoring's ``eval_memory`` (cached).

  Args:
    scoring: what the model is scored with (``rows.Scoring`` of a restored
      run: its model, signature, path and step).
    metric: 'dot_product' or 'squared_l2'.
    workdir: the directory whose datastore is read (unless
      ``eval_memory.datastore`` names one).
  """
  em = scoring.memory
  path = datastore_path(scoring, workdir)
  store = ds_lib.open_datastore(
      path,
      signature=scoring.signature,
      dim=scoring.model.cfg.d_model,
      checkpoint=datastore_checkpoint(scoring),
      window_bos=scoring.window_bos,
  )
  search_lib.check_k(store, int(em.ext_k))
  key = (path, store.manifest["id"], metric, em.search)
  key += (em.leaves_to_search, em.reorder_candidates)
  if em.search == "scann":  # an index rebuilt since is loaded again
    key += (search_lib.index_id(store, metric),)
  if key not in _SEARCHERS:
    _SEARCHERS[key] = search_lib.make_searcher(
        store,
        metric,
        em.search,
        int(em.leaves_to_search),
        int(em.reorder_candidates),
    )
  return ExternalSearch(
      _SEARCHERS[key],
      int(em.ext_k),
      bool(em.pipeline),
      rescore=bool(em.rescore),
  )
