"""Evaluation with an external memory: kNN-LM and TRIMELM_ext.

Both read the K nearest (g, next token) pairs of a datastore
(``memory/datastore.py``), searched on the host (``memory/search.py``) with
the neighbours' scores recomputed from the stored keys:

* ``knn`` (Khandelwal et al. 2020): p = lam p_kNN + (1 - lam) p_LM, with
  p_kNN(w) = sum_{j: x_j = w} exp(-||g - g_j||^2 / T) / sum_j exp(...) over
  the K neighbours by squared L2 distance; T = 1 (no temperature) unless
  tuned. No local memory.
* ``trime_ext`` (TRIME Eq. 6-9): the K neighbours by inner product join
  M_local u M_long in one softmax with the vocabulary, memory logits
  g . g_j / (sqrt(d) tau) (Eq. 6-7); then P' over all of M_eval (local,
  long and external) at tau' (Eq. 8) and P_final = (1 - lam) P + lam P'
  (Eq. 9; lam = 0 is Eq. 6 alone). With no external neighbours (K = 0) it
  is exactly TRIMELM_long's M_local u M_long.

The accelerator computes a batch's features and its local/long sums
(``evaluation.make_eval_step``); the host searches the datastore; a second
jitted function adds the external sums and combines. With ``pipeline`` the
host searches batch t in a worker thread while batch t + 1's forward pass
runs; the results equal the sequential ones.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from memjax import console
from memjax import errors
from memjax import registry
from memjax import sharding as sharding_lib
from memjax.data import streams
from memjax.memory import blockwise
from memjax.memory import cache
from memjax.memory import evaluation
from memjax.memory import search as search_lib
from memjax.memory import trime

Array = jax.Array


def masked_lse(scores: Array, mask: Array) -> Array:
  """log sum_{mask} exp(scores) over the last axis; -inf where empty."""
  s = jnp.where(mask, scores, -jnp.inf)
  m = jnp.max(s, axis=-1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  total = jnp.sum(jnp.where(mask, jnp.exp(s - m), 0.0), axis=-1)
  ok = total > 0
  return jnp.where(ok, m[..., 0] + jnp.log(jnp.where(ok, total, 1.0)), -jnp.inf)


class KnnMemory(evaluation.EvalMemory):
  """kNN-LM: lam p_kNN + (1 - lam) p_LM over K neighbours by squared L2."""

  axes = (
      evaluation.Axis("knn_temperature", "knn_temperatures",
                      "knn_temperature_grid"),
      evaluation.Axis("knn_lambda", "knn_lambdas", "knn_lambda_grid"),
  )  # fmt: skip
  label = "kNN-LM (tuned lambda)"
  external_metric = "squared_l2"
  reads_local = False

  def check(self, settings: evaluation.Settings) -> None:
    if not settings["knn_temperatures"] or not settings["knn_lambdas"]:
      raise errors.ConfigError(
          "knn evaluation needs at least one knn_temperature and knn_lambda"
      )
    if min(settings["knn_temperatures"]) <= 0:
      raise errors.ConfigError("eval_memory.knn_temperature must be > 0")

  def scales(self, settings: evaluation.Settings, dim: int) -> list[float]:
    del dim
    return [1.0 / t for t in settings["knn_temperatures"]]

  def combine(self, settings, lm, log_z, sums):
    """[N, T, L, W, S]: sums are over the neighbours (score = -L2)."""
    del log_z
    lam = jnp.asarray(settings["knn_lambdas"], jnp.float32)[None, :, None, None]
    return jnp.stack(
        [cache.cache_from_sums(lm[None, None], a[:, None], p[:, None], lam)
         for a, p in sums]
    )  # fmt: skip


class TrimeExtMemory(evaluation.EvalMemory):
  """TRIMELM_ext: Eq. 6-7 over M_local u M_long u kNN(M_ext), then Eq. 8-9."""

  axes = (
      evaluation.Axis("temperature", "temperatures", "temperature_grid"),
      evaluation.Axis("ext_temperature", "ext_temperatures",
                      "ext_temperature_grid"),
      evaluation.Axis("ext_lambda", "ext_lambdas", "ext_lambda_grid"),
  )  # fmt: skip
  label = "TRIMELM_ext (Eq. 6-9)"
  external_metric = "dot_product"
  reads_local = True

  def check(self, settings: evaluation.Settings) -> None:
    for key in ("temperatures", "ext_temperatures", "ext_lambdas"):
      if not settings[key]:
        raise errors.ConfigError(f"trime_ext evaluation needs {key}")

  def scales(self, settings: evaluation.Settings, dim: int) -> list[float]:
    taus = list(settings["temperatures"]) + list(settings["ext_temperatures"])
    return [1.0 / (math.sqrt(dim) * t) for t in taus]

  def combine(self, settings, lm, log_z, sums):
    """[N, tau, tau', lam, W, S]."""
    g1 = len(settings["temperatures"])
    lam = jnp.asarray(settings["ext_lambdas"], jnp.float32)
    lam = lam[None, None, :, None, None]
    out = []
    for a, p in sums:
      eq6 = trime.combine_log_prob(lm[None], log_z[None], a[:g1], p[:g1])
      out.append(
          cache.cache_from_sums(
              eq6[:, None, None], a[g1:][None, :, None],
              p[g1:][None, :, None], lam,
          )
      )  # fmt: skip
    return jnp.stack(out)


class KnnCacheMemory(evaluation.EvalMemory):
  """kNN-LM with a continuous cache (Table 2's "kNN-LM + continuous cache").

  The cache of Grave et al. over M_local u M_long is interpolated with the
  kNN-LM (Khandelwal et al. 2020, §6): p = lam_c p_cache + (1 - lam_c)
  (lam p_kNN + (1 - lam) p_LM), where p_cache uses theta g . g_j over the
  visible memory and p_kNN the K neighbours' -||g - g_j||^2 / T. At
  lam_c = 0 it is the kNN-LM, at lam = 0 the model with the cache.
  """

  axes = (
      evaluation.Axis("cache_theta", "thetas", "cache_theta_grid"),
      evaluation.Axis("cache_lambda", "lambdas", "cache_lambda_grid"),
  ) + KnnMemory.axes
  label = "kNN-LM + continuous cache (tuned)"
  external_metric = "squared_l2"
  reads_local = True
  joins_local = False

  def check(self, settings: evaluation.Settings) -> None:
    KnnMemory().check(settings)
    if not settings["thetas"] or not settings["lambdas"]:
      raise errors.ConfigError(
          "knn_cache evaluation needs at least one cache theta and lambda"
      )

  def scales(self, settings: evaluation.Settings, dim: int) -> list[float]:
    """The cache's thetas, then the kNN-LM's 1 / T."""
    return list(settings["thetas"]) + KnnMemory().scales(settings, dim)

  def combine(self, settings, lm, log_z, sums):
    """[N, theta, lam_c, T, lam, W, S]; sums are (cache all, cache pos,
    neighbours all, neighbours pos) per N."""
    del log_z
    g1 = len(settings["thetas"])
    lam_c = jnp.asarray(settings["lambdas"], jnp.float32)
    lam = jnp.asarray(settings["knn_lambdas"], jnp.float32)
    out = []
    for a, p, e_a, e_p in sums:
      knn = cache.cache_from_sums(
          lm[None, None],
          e_a[g1:, None],
          e_p[g1:, None],
          lam[None, :, None, None],
      )  # [T, lam, W, S]
      out.append(
          cache.cache_from_sums(
              knn[None, None], a[:g1, None, None, None],
              p[:g1, None, None, None], lam_c[None, :, None, None, None, None],
          )
      )  # fmt: skip
    return jnp.stack(out)


registry.EVAL_MEMORIES.register("knn", KnnMemory())
registry.EVAL_MEMORIES.register("knn_cache", KnnCacheMemory())
registry.EVAL_MEMORIES.register("trime_ext", TrimeExtMemory())


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
    return masked_lse(s, valid), masked_lse(s, pos)

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
  """

  searcher: Any
  k: int
  pipeline: bool = True
  search_seconds: float = 0.0

  def neighbours(self, queries: np.ndarray):
    """(scores [Q, K], values [Q, K]) recomputed from the stored keys."""
    start = time.perf_counter()
    if self.searcher is None or self.k == 0:
      q = queries.shape[0]
      empty = np.zeros((q, 0))
      return empty.astype(np.float32), empty.astype(np.int32)
    _, idx = self.searcher.search(queries, self.k)
    scores, values = search_lib.exact_scores(
        self.searcher.store, queries, idx, self.searcher.metric
    )
    self.search_seconds += time.perf_counter() - start
    return scores, values


def run_stream(
    step: Any,
    model: Any,
    params: Any,
    tokens: np.ndarray,
    grid: Any,
    external: ExternalSearch,
    *,
    window_len: int,
    score_len: int,
    batch_size: int,
    mesh: Any,
    keep_tokens: bool,
    desc: str,
    compiled: Optional[dict[Any, Any]] = None,
) -> tuple[list[dict[str, Any]], float]:
  """Scores a stream with an external memory: the per-batch sums of
  ``evaluate_memory.score_stream`` and its start time (``compiled``: keeps
  the jitted functions of ``step`` between calls, as there)."""
  if external is None:
    raise errors.ConfigError(f"{grid.kind} evaluation needs a datastore")
  memory = grid.memory()
  settings = {
      "temperatures": grid.temperatures,
      "thetas": grid.thetas,
      "lambdas": grid.lambdas,
      **grid.extra_settings(),
  }
  key = ("external", id(step))  # step is kept alive by score_stream's entry
  if compiled is None or key not in compiled:
    fns = (
        sharding_lib.under_mesh(jax.jit(step, donate_argnums=(1,)), mesh),
        jax.jit(make_combine_fn(memory, settings, model.d_model)),
    )
    if compiled is not None:
      compiled[key] = fns
  dev, combine = compiled[key] if compiled is not None else fns

  def finish(out, fut) -> dict[str, Any]:
    scores, values = fut.result() if hasattr(fut, "result") else fut
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
          grid_tok=logp, lm_tok=out["lm"], w_tok=w,
          tgt_tok=out["targets"], pos_tok=out["positions"],
      )  # fmt: skip
    return jax.device_get(res)

  def host_search(out):
    q = np.asarray(out["queries"])
    return external.neighbours(q.reshape(-1, q.shape[-1]))

  bank = evaluation.init_bank(step.capacity, model.d_model)
  pool = concurrent.futures.ThreadPoolExecutor(1)
  start, last = time.time(), time.time()
  fetched, prev = [], None
  batches = streams.memory_eval_batches(
      tokens, window_len, score_len, batch_size
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
            desc, i + 1, last - start, external.search_seconds,
        )  # fmt: skip
    if prev is not None:
      fetched.append(finish(*prev))
  finally:
    pool.shutdown()
  return fetched, start
