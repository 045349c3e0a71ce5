"""The external evaluation memories: kNN-LM, kNN-LM with a cache, TRIMELM_ext.

All read the K nearest (g, next token) pairs of a datastore
(``memjax/memory/datastore.py``), searched on the host
(``memjax/memory/search.py``) with the neighbours' scores recomputed from
the stored keys; ``memjax/eval/external.py`` runs the search and hands each
kind its sums over the neighbours:

* ``knn`` (Khandelwal et al. 2020): p = lam p_kNN + (1 - lam) p_LM, with
  p_kNN(w) = sum_{j: x_j = w} exp(-||g - g_j||^2 / T) / sum_j exp(...) over
  the K neighbours by squared L2 distance; T = 1 (no temperature) unless
  tuned. No local memory.
* ``knn_cache``: the kNN-LM interpolated with the continuous cache over
  M_local u M_long (Table 2's "kNN-LM + continuous cache").
* ``trime_ext`` (TRIME Eq. 6-9): the K neighbours by inner product join
  M_local u M_long in one softmax with the vocabulary, memory logits
  g . g_j / (sqrt(d) tau) (Eq. 6-7); then P' at g . g_j / tau' (Eq. 8, tau'
  in the authors' units: the raw inner product, no sqrt(d)) and
  P_final = (1 - lam) P + lam P' (Eq. 9; lam = 0 is Eq. 6 alone). P' runs
  over the K external neighbours only (``ext_interp_local`` = 0, the
  authors' code) or over all of M_eval, local, long and external (= 1, the
  paper's text). With no external neighbours (K = 0) it is exactly
  TRIMELM_long's M_local u M_long.

The authors' evaluation (princeton-nlp/TRIME): ``fairseq/sequence_scorer.py``
39-52 and 79-98 build Eq. 6's logits, dists / sqrt(d) / softmax_temp over
M_local u M_long u kNN; lines 163-181 then interpolate with
``fairseq/knnlm.py`` 127-151, ``log_softmax(dists / temp)`` (line 139) over
the K neighbours only, where ``dists`` are faiss's raw inner products
(``--faiss-metric-type ip``, ``knn_sim_func`` None: ``dist_func`` 91-105
returns them as they are) and temp is ``--interp-temp`` (README: 10.5).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from memjax import errors
from memjax.memory import blockwise
from memjax.memory import evaluation
from memjax.methods.cache import continuous_cache as cache
from memjax.methods.external import config as ext_config
from memjax.methods.trime import in_batch as trime


class KnnMemory(evaluation.EvalMemory):
  """kNN-LM: lam p_kNN + (1 - lam) p_LM over K neighbours by squared L2."""

  axes = (
      evaluation.Axis(
          "knn_temperature",
          "knn_temperatures",
          "knn_temperature_grid",
          section=ext_config.ExternalEvalMemory,
      ),
      evaluation.Axis(
          "knn_lambda",
          "knn_lambdas",
          "knn_lambda_grid",
          section=ext_config.ExternalEvalMemory,
      ),
  )
  label = "kNN-LM (tuned lambda)"
  external_metric = "squared_l2"
  reads_local = False

  def check(self, settings: evaluation.AxisValues) -> None:
    if not settings["knn_temperatures"] or not settings["knn_lambdas"]:
      raise errors.ConfigError(
          "knn evaluation needs at least one knn_temperature and knn_lambda"
      )
    if min(settings["knn_temperatures"]) <= 0:
      raise errors.ConfigError("external.knn_temperature must be > 0")

  def scales(self, settings: evaluation.AxisValues, dim: int) -> list[float]:
    del dim
    return [1.0 / t for t in settings["knn_temperatures"]]

  def combine(self, settings, lm, log_z, sums):
    """[N, T, L, W, S]: sums are over the neighbours (score = -L2)."""
    del log_z
    lam = jnp.asarray(settings["knn_lambdas"], jnp.float32)[None, :, None, None]
    return jnp.stack(
        [
            cache.cache_from_sums(lm[None, None], a[:, None], p[:, None], lam)
            for a, p in sums
        ]
    )


class TrimeExtMemory(evaluation.EvalMemory):
  """TRIMELM_ext: Eq. 6-7 over M_local u M_long u kNN(M_ext), then Eq. 8-9.

  The axis ``ext_interp_local`` picks the set P' (Eq. 8) runs over: 0, the
  K external neighbours only (the authors' ``knnlm.py:139``); 1, all of
  M_eval (the paper's text). tau' divides the raw inner product in both.
  """

  axes = trime.TrimeMemory.axes + (
      evaluation.Axis(
          "ext_temperature",
          "ext_temperatures",
          "ext_temperature_grid",
          section=ext_config.ExternalEvalMemory,
      ),
      evaluation.Axis(
          "ext_lambda",
          "ext_lambdas",
          "ext_lambda_grid",
          section=ext_config.ExternalEvalMemory,
      ),
      evaluation.Axis(
          "ext_interp_local",
          "ext_interp_locals",
          "ext_interp_local_grid",
          (0.0,),
          section=ext_config.ExternalEvalMemory,
      ),
  )
  label = "TRIMELM_ext (Eq. 6-9)"
  external_metric = "dot_product"
  reads_local = True
  joins_local = False  # combine joins them itself: P' may leave M_local out

  def check(self, settings: evaluation.AxisValues) -> None:
    for key in ("temperatures", "ext_temperatures", "ext_lambdas"):
      if not settings[key]:
        raise errors.ConfigError(f"trime_ext evaluation needs {key}")
    if not set(settings.get("ext_interp_locals", (0.0,))) <= {0.0, 1.0}:
      raise errors.ConfigError(
          "external.ext_interp_local must be 0 (P' over the external "
          "neighbours) or 1 (over all of M_eval)"
      )

  def scales(self, settings: evaluation.AxisValues, dim: int) -> list[float]:
    """1 / (sqrt(d) tau) for Eq. 6, then 1 / tau' (raw g . g_j) for Eq. 8."""
    eq6 = [1.0 / (math.sqrt(dim) * t) for t in settings["temperatures"]]
    return eq6 + [1.0 / t for t in settings["ext_temperatures"]]

  def combine(self, settings, lm, log_z, sums):
    """[N, tau, tau', lam, interp, W, S]; sums are (local all, local pos,
    neighbours all, neighbours pos) [G, W, S] per N."""
    g1 = len(settings["temperatures"])
    lam = jnp.asarray(settings["ext_lambdas"], jnp.float32)
    lam = lam[None, None, :, None, None]
    out = []
    for a, p, e_a, e_p in sums:
      j_a, j_p = blockwise.logaddexp(a, e_a), blockwise.logaddexp(p, e_p)
      eq6 = trime.combine_log_prob(lm[None], log_z[None], j_a[:g1], j_p[:g1])
      per_set = []
      for reads_local in settings.get("ext_interp_locals", (0.0,)):
        s_a, s_p = (j_a, j_p) if reads_local else (e_a, e_p)
        per_set.append(
            cache.cache_from_sums(
                eq6[:, None, None],
                s_a[g1:][None, :, None],
                s_p[g1:][None, :, None],
                lam,
            )
        )
      out.append(jnp.stack(per_set, axis=3))
    return jnp.stack(out)


class KnnCacheMemory(evaluation.EvalMemory):
  """kNN-LM with a continuous cache (Table 2's "kNN-LM + continuous cache").

  The cache of Grave et al. over M_local u M_long is interpolated with the
  kNN-LM (Khandelwal et al. 2020, §6): p = lam_c p_cache + (1 - lam_c)
  (lam p_kNN + (1 - lam) p_LM), where p_cache uses theta g . g_j over the
  visible memory and p_kNN the K neighbours' -||g - g_j||^2 / T. At
  lam_c = 0 it is the kNN-LM, at lam = 0 the model with the cache.
  """

  axes = cache.CacheMemory.axes + KnnMemory.axes
  label = "kNN-LM + continuous cache (tuned)"
  external_metric = "squared_l2"
  reads_local = True
  joins_local = False

  def check(self, settings: evaluation.AxisValues) -> None:
    KnnMemory().check(settings)
    if not settings["thetas"] or not settings["lambdas"]:
      raise errors.ConfigError(
          "knn_cache evaluation needs at least one cache theta and lambda"
      )

  def scales(self, settings: evaluation.AxisValues, dim: int) -> list[float]:
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
              knn[None, None],
              a[:g1, None, None, None],
              p[:g1, None, None, None],
              lam_c[None, :, None, None, None, None],
          )
      )
    return jnp.stack(out)
