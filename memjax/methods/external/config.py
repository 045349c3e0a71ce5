"""The external memories' settings.

kNN-LM and TRIMELM_ext read a datastore of (g, next token) built by
``--mode=datastore`` (its settings: the engine's ``datastore`` section, which
the evaluation's datastore path reads too) and searched
with the ScaNN index of ``--mode=index`` or exactly (the engine's
``eval_memory.datastore``, ``search``, ``ext_k``...).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class ExternalEvalMemory:
  """``config.external``: the evaluation memories with an external memory
  (knn, knn_cache, trime_ext).

  Attributes:
    external_kind: the method's kind with M_ext (demos).
    ext_temperature: tau' of Eq. 8 (trime_ext) in the authors' units: P' ~
      exp(g . g_j / tau'), the raw inner product (no sqrt(d)), as their
      --interp-temp 10.5.
    ext_lambda: lambda of Eq. 9 (trime_ext); 0 = Eq. 6.
    ext_interp_local: the set P' runs over: 0 = the K external neighbours
      (the authors' code, knnlm.py:139), 1 = all of M_eval, local, long and
      external (Eq. 8's text).
    ext_temperature_grid, ext_lambda_grid: what ``--mode=tune`` tries.
    ext_interp_local_grid: () = ext_interp_local only.
    knn_temperature: kNN-LM: none, as in Khandelwal et al.
    knn_lambda: the kNN-LM interpolation weight.
    knn_temperature_grid, knn_lambda_grid: what ``--mode=tune`` tries.
  """

  SECTION: ClassVar[str] = "external"
  external_kind: str = ""
  ext_temperature: float = 10.5
  ext_lambda: float = 0.3
  ext_interp_local: float = 0.0
  ext_temperature_grid: tuple[float, ...] = (2.5, 5.0, 10.5, 20.0, 40.0, 80.0)
  ext_lambda_grid: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.5)
  ext_interp_local_grid: tuple[float, ...] = ()
  knn_temperature: float = 1.0
  knn_lambda: float = 0.25
  knn_temperature_grid: tuple[float, ...] = (1.0,)
  knn_lambda_grid: tuple[float, ...] = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5)


@dataclasses.dataclass(frozen=True)
class MtMemory:
  """``config.mt_memory``: the external memory of a translation run at
  decoding time (``translation.memory`` before; the defaults are kNN-MT's
  of ``configs/trime_iwslt.py``).

  Attributes:
    kind: 'knn' (kNN-MT) or 'trime' (TRIMEMT_ext's joint softmax).
    datastore: '' = <workdir>/mt_datastore.
    search: scann | exact.
    rows: pairs per teacher-forced batch (datastore, tuning).
    shard_keys: about this many positions per datastore shard.
    show_sentences: --mode=mt_datastore: source sentences whose greedy
      translation it follows, writing the k nearest entries' tokens at each
      target position (<workdir>/mt_retrieved.json).
    process_index, process_count: --mode=mt_datastore over processes:
      process k writes the shards s with s % n == k (-1 / 0:
      jax.process_index() / jax.process_count()).
    k: neighbours.
    knn_lambda, knn_temperature: kNN-MT (Khandelwal et al. 2021).
    temperature: TRIMEMT_ext's memory logits g . g_j / (sqrt(d) tau).
    interpolate, interpolate_lambda: a tuned lam instead of the memory's
      mass.
    unnormalised: with lam = the memory mass: False = (1 - lam) p_MT + lam
      p_mem, Eq. 6's normalised joint softmax; True = (1 - lam) p_MT +
      p_mem, as the authors' transformer.py 1235 returns it.
    tune_sentences: valid sentences of --mode=mt_tune.
    k_grid, knn_lambda_grid, knn_temperature_grid, temperature_grid,
      interpolate_lambda_grid: what --mode=mt_tune tries.
  """

  SECTION: ClassVar[str] = "mt_memory"
  kind: str = "knn"
  datastore: str = ""
  search: str = "scann"
  rows: int = 64
  shard_keys: int = 1 << 20
  show_sentences: tuple[str, ...] = ()
  process_index: int = -1
  process_count: int = 0
  k: int = 32
  knn_lambda: float = 0.2
  knn_temperature: float = 100.0
  temperature: float = 1.0
  interpolate: bool = False
  interpolate_lambda: float = 0.2
  unnormalised: bool = False
  tune_sentences: int = 200
  k_grid: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  knn_lambda_grid: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)
  knn_temperature_grid: tuple[float, ...] = (10.0, 100.0, 1000.0)
  temperature_grid: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
  interpolate_lambda_grid: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)


SETTINGS = (ExternalEvalMemory, MtMemory)
# Keys that moved into ``external`` and ``mt_memory``.
RENAMES = {
    **{
        f"eval_memory.{f.name}": f"external.{f.name}"
        for f in dataclasses.fields(ExternalEvalMemory)
    },
    "translation.memory": "mt_memory",
}
