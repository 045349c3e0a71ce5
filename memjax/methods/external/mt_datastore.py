"""The external memory of translation (TRIME paper, Section 5.4).

Every training translation context (x, y_<t) with its target token y_t: the
key is g, the last decoder layer's feed-forward input under teacher forcing,
the value y_t. The pairs go through the generic datastore build
(``memory/datastore_batches.py``: float16 keys, int32 values, shards,
manifest) and the ScaNN index of ``memory/search.py``; one index per metric
(kNN-MT searches by squared L2, TRIMEMT_ext by inner product).

The manifest records the model signature, the checkpoint and the SHA-1 of
the run's sentencepiece model; a datastore of another model or another
vocabulary is refused with one line (``CheckpointMismatchError``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax import sharding as sharding_lib
from memjax.checkpoints import runfiles
from memjax.data import token_batching
from memjax.io import console
from memjax.io import paths
from memjax.memory import datastore as ds_lib
from memjax.memory import datastore_batches
from memjax.memory import search as search_lib
from memjax.memory import shards
from memjax.methods.external import config as ext_config
from memjax.models import variables as model_vars
from memjax.tasks import config as task_config
from memjax.tasks.translation import parts

Settings = settings_lib.Settings


def datastore_path(s: Settings, workdir: str) -> str:
  """``mt_memory.datastore``, else ``<workdir>/mt_datastore``."""
  path = s.of(ext_config.MtMemory).datastore
  return paths.resolve(path or paths.join(workdir, "mt_datastore"))


def batch_plan(
    source: Sequence[np.ndarray],
    target: Sequence[np.ndarray],
    buckets: Sequence[int],
    rows: int,
) -> list[tuple[int, np.ndarray]]:
  """Deterministic batches of pairs: (bucket length, pair indices), each
  pair in the smallest bucket that holds both sides (longer pairs are left
  out, as in training), in corpus order within a bucket."""
  buckets = sorted(int(b) for b in buckets)
  longest = np.maximum([len(s) for s in source], [len(t) for t in target])
  which = np.searchsorted(np.asarray(buckets), longest)
  plan = []
  for i, b in enumerate(buckets):
    members = np.flatnonzero(which == i)
    plan += [(b, members[j : j + rows]) for j in range(0, len(members), rows)]
  return plan


def plan_batch(
    source: Sequence[np.ndarray],
    target: Sequence[np.ndarray],
    bucket: int,
    idx: np.ndarray,
    rows: int,
) -> dict[str, np.ndarray]:
  """The arrays of one planned batch, filled to ``rows`` with empty pairs;
  'index' [rows] is each row's pair index (-1 for filling)."""
  empty = np.zeros((0,), np.int32)
  fill = rows - len(idx)
  batch = token_batching.make_pair_batch(
      [source[i] for i in idx] + [empty] * fill,
      [target[i] for i in idx] + [empty] * fill,
      bucket,
      bucket,
  )
  batch["index"] = np.concatenate([idx, -np.ones(fill, np.int64)])
  batch["index"] = batch["index"].astype(np.int32)
  return batch


def make_teacher_forced_fn(model: Any):
  """``fn(params, batch) -> dict`` of a planned batch: 'g' [B, T, D],
  'tlp' / 'log_z' [B, T], 'targets', 'weights' and 'positions' [B, T]
  (pair index * T + t, -1 on padding)."""

  def fn(params, batch):
    out = model.apply(
        model_vars.as_variables(params),
        batch["inputs"],
        batch["targets"],
        source=batch["source"],
        deterministic=True,
    )
    t = batch["targets"].shape[1]
    pos = batch["index"][:, None] * t + jnp.arange(t)[None, :]
    return {
        "g": out.features,
        "tlp": out.target_logprob,
        "log_z": out.log_z,
        "targets": batch["targets"],
        "weights": batch["weights"],
        "positions": jnp.where(batch["weights"] > 0, pos, -1),
    }

  return fn


def _rows(s: Settings, restored: Any) -> int:
  dp = sharding_lib.data_parallel(restored.mesh)
  rows = int(s.of(ext_config.MtMemory).rows)
  return -(-rows // dp) * dp


def teacher_forced(
    s: Settings, restored: Any, split: Any, limit: int = 0
) -> Iterator[dict[str, np.ndarray]]:
  """Yields the teacher-forced outputs (``make_teacher_forced_fn``) of the
  first ``limit`` pairs (0: all) of a ``parallel.ParallelSplit``."""
  n = len(split.source) if not limit else min(limit, len(split.source))
  src, tgt = split.source[:n], split.target[:n]
  rows = _rows(s, restored)
  plan = batch_plan(src, tgt, s.of(task_config.Translation).buckets, rows)
  fn = sharding_lib.jit(make_teacher_forced_fn(restored.model), restored.mesh)
  for b, idx in plan:
    batch = plan_batch(src, tgt, b, idx, rows)
    put = sharding_lib.put_global_batch(batch, restored.mesh)
    yield jax.device_get(fn(restored.variables, put))


def _signature(restored: Any) -> dict[str, Any]:
  return restored.run.signature(restored.vocab_size)


def _checkpoint(restored) -> dict[str, Any]:
  return {"source": paths.realpath(restored.path), "step": int(restored.step)}


def vocab_sha1(restored) -> str:
  return runfiles.file_sha1(paths.join(restored.path, runfiles.SPM_FILE))


def process_share(s: Settings) -> tuple[int, int]:
  """(k, n): this build writes the shards s with s % n == k.

  ``mt_memory.process_index`` / ``process_count`` when set (>= 0 /
  > 0), else jax.process_index() / jax.process_count().

  Raises:
    errors.ConfigError: k outside [0, n).
  """
  mem = s.of(ext_config.MtMemory)
  return shards.process_share(mem.process_index, mem.process_count, "mt_memory")


def build(s: Settings, restored: Any, train: Any, path: str) -> Any:
  """Builds (or resumes) this process's share of the datastore of
  ``train``'s target positions (see :func:`process_share`).

  Returns:
    The joined datastore, or None while other processes' shards are missing.

  Raises:
    errors.CheckpointMismatchError: ``path`` holds a build of another model.
  """
  process_index, process_count = process_share(s)
  rows = _rows(s, restored)
  t = s.of(task_config.Translation)
  plan = batch_plan(train.source, train.target, t.buckets, rows)
  mem = s.of(ext_config.MtMemory)
  spec = datastore_batches.BatchBuildSpec(
      signature=_signature(restored),
      checkpoint=_checkpoint(restored),
      dim=int(restored.model.cfg.d_model),
      corpus=paths.resolve(parts.data_dir(s.data)),
      split="train",
      context={
          "task": "translation",
          "values": "target tokens",
          "target_lang": t.target_lang,
          "vocab_sha1": vocab_sha1(restored),
      },
      num_batches=len(plan),
      shard_batches=max(1, int(mem.shard_keys) // (rows * plan[0][0])),
  )
  ds_lib.check_build_dir(path, spec)
  fn = sharding_lib.jit(make_teacher_forced_fn(restored.model), restored.mesh)

  def features(batch):
    out = fn(
        restored.variables, sharding_lib.put_global_batch(batch, restored.mesh)
    )
    return out["g"], out["targets"], out["positions"]

  def batches(first: int, stop: int):
    for b, idx in plan[first:stop]:
      yield plan_batch(train.source, train.target, b, idx, rows)

  console.info(
      "MT datastore: %d batches of %d pairs into %s", len(plan), rows, path
  )
  return datastore_batches.build_from_batches(
      features,
      batches,
      spec,
      path,
      process_index=process_index,
      process_count=process_count,
  )


def open_store(restored: Any, path: str) -> ds_lib.Datastore:
  """Opens the datastore at ``path`` for ``restored``.

  Raises:
    errors.DataError: no datastore there.
    errors.CheckpointMismatchError: built by another model, checkpoint or
      from another vocabulary.
  """
  store = ds_lib.open_datastore(
      path,
      signature=_signature(restored),
      dim=int(restored.model.cfg.d_model),
      checkpoint=_checkpoint(restored),
  )
  context = store.manifest.get("context") or {}
  saved, mine = context.get("vocab_sha1"), vocab_sha1(restored)
  if saved != mine:
    raise errors.CheckpointMismatchError(
        f"datastore {path} was built from another vocabulary (spm sha1 "
        f"{str(saved)[:12]}, the run's {mine[:12]}): build one with this run "
        "(--mode=mt_datastore into another mt_memory.datastore)"
    )
  return store


def searcher(store: ds_lib.Datastore, metric: str, mem: Any, k: int) -> Any:
  """The ``mem.search`` ('scann' or 'exact') searcher of ``store``; a ScaNN
  index missing for ``metric`` is built first."""
  if mem.search == "scann" and not paths.exists(
      paths.join(search_lib.index_dir(store.path, metric), "index.json")
  ):
    search_lib.build_index(store, metric, k)
  return search_lib.make_searcher(store, metric, mem.search)


@dataclasses.dataclass(eq=False)  # hashed by identity: a callback
class Neighbours:
  """Host-side search of the K nearest (g, token) pairs, exact scores.

  Attributes:
    searcher: a ``search`` searcher, or None for an empty memory.
    k: neighbours per query.
    seconds: time spent searching.
    queries: queries answered.
  """

  searcher: Any
  k: int
  seconds: float = 0.0
  queries: int = 0

  def __call__(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k] float32, -inf for none; values [Q, k] int32):
    g . g_j for 'dot_product', -||g - g_j||^2 for 'squared_l2'."""
    start = time.perf_counter()
    q = np.asarray(queries, np.float32)
    scores = np.full((q.shape[0], self.k), -np.inf, np.float32)
    values = np.zeros((q.shape[0], self.k), np.int32)
    if self.searcher is not None and self.searcher.store.count:
      k = min(self.k, self.searcher.store.count)
      _, idx = self.searcher.search(q, k)
      s, v = search_lib.exact_scores(
          self.searcher.store, q, idx, self.searcher.metric
      )
      scores[:, : s.shape[1]], values[:, : v.shape[1]] = s, v
    self.seconds += time.perf_counter() - start
    self.queries += q.shape[0]
    return scores, values
