"""Scoring token streams with testing memories (TRIME Eq. 6, the cache).

``score_stream`` scores a stream with every setting of a ``Grid`` (memory
kind, long-term memory sizes, temperatures or cache lambda/theta) in one
pass; ``load`` restores a run through ``memjax.experiment`` with the splits
it scores. The modes built on these (memeval, tune, memsweep, buckets) are in
``memjax/modes/memory.py``; the memory computations in
``memjax/memory/evaluation.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from memjax import console
from memjax.eval import windows as evaluate
from memjax import sharding as sharding_lib
from memjax import experiment
from memjax import registry
from memjax.data import streams
from memjax.memory import evaluation

# ----------------------------------------------------------------------------
# Grids
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Grid:
  """The settings one pass scores.

  Attributes:
    kind: a name in ``registry.EVAL_MEMORIES`` ('none', 'trime', 'cache').
    long_sizes: long-term memory sizes N (0 = M_local only).
    temperatures: tau values (trime).
    thetas: cache inverse temperatures.
    lambdas: cache interpolation weights.
    ext_temperatures: tau' of Eq. 8 (trime_ext).
    ext_lambdas: lambda of Eq. 9 (trime_ext).
    knn_temperatures: kNN-LM temperatures (1 = none, as in kNN-LM).
    knn_lambdas: kNN-LM interpolation weights.
  """

  kind: str
  long_sizes: tuple[int, ...] = (0,)
  temperatures: tuple[float, ...] = (1.0,)
  thetas: tuple[float, ...] = ()
  lambdas: tuple[float, ...] = ()
  ext_temperatures: tuple[float, ...] = ()
  ext_lambdas: tuple[float, ...] = ()
  knn_temperatures: tuple[float, ...] = ()
  knn_lambdas: tuple[float, ...] = ()

  def extra_settings(self) -> dict[str, tuple[float, ...]]:
    """The external memories' axes (``make_eval_step``'s extra_settings)."""
    return {k: getattr(self, k) for k in EXTRA_AXES}

  def memory(self) -> evaluation.EvalMemory:
    """The evaluation memory of ``kind``."""
    return registry.EVAL_MEMORIES.get(self.kind)

  def axes(self) -> dict[str, tuple[Any, ...]]:
    """The values of each axis, in the step's grid order (N first)."""
    out: dict[str, tuple[Any, ...]] = {"long_mem_tokens": self.long_sizes}
    for axis in self.memory().axes:
      out[axis.key] = tuple(getattr(self, axis.values))
    return out

  def points(self) -> list[dict[str, Any]]:
    """Settings in the order of the step's flattened grid axes (none for a
    kind without memory)."""
    if not self.memory().uses_memory:
      return []
    axes = self.axes()
    return [
        dict(zip(axes, values)) for values in itertools.product(*axes.values())
    ]


# Grid fields of the external memories' axes and their config keys.
EXTRA_AXES = {
    "ext_temperatures": "ext_temperature",
    "ext_lambdas": "ext_lambda",
    "knn_temperatures": "knn_temperature",
    "knn_lambdas": "knn_lambda",
}


def _floats(xs) -> tuple[float, ...]:
  return tuple(float(x) for x in xs)


def configured_grid(em: ml_collections.ConfigDict) -> Grid:
  """The single setting of ``config.eval_memory``."""
  return Grid(
      kind=em.kind,
      long_sizes=(int(em.long_mem_tokens),),
      temperatures=(float(em.temperature),),
      thetas=(float(em.cache_theta),),
      lambdas=(float(em.cache_lambda),),
      **{f: (float(em[key]),) for f, key in EXTRA_AXES.items()},
  )


def tuning_grid(
    em: ml_collections.ConfigDict,
    kind: str,
    long_sizes: Optional[Sequence[int]] = None,
) -> Grid:
  """The tuning grid of ``config.eval_memory`` for ``kind``."""
  sizes = tuple(
      int(n)
      for n in (
          long_sizes
          if long_sizes is not None
          else (em.long_mem_grid or (em.long_mem_tokens,))
      )
  )
  return Grid(
      kind=kind,
      long_sizes=sizes,
      temperatures=_floats(em.temperature_grid),
      thetas=_floats(em.cache_theta_grid),
      lambdas=_floats(em.cache_lambda_grid),
      **{f: _floats(em[key + "_grid"]) for f, key in EXTRA_AXES.items()},
  )


# ----------------------------------------------------------------------------
# Scoring a stream
# ----------------------------------------------------------------------------


def truncate_windows(
    tokens: np.ndarray, window_len: int, score_len: int, max_windows: int
) -> np.ndarray:
  """The prefix of ``tokens`` that the first ``max_windows`` windows of
  ``streams.eval_windows`` cover (all of it for 0), as memjax.eval.windows does.
  """
  if not max_windows:
    return tokens
  windows = streams.eval_windows(len(tokens) - 1, window_len, score_len)
  last = windows[min(max_windows, len(windows)) - 1]
  return tokens[: int(last[0]) + int(last[1]) + 1]


def _scoring_fns(
    model: Any,
    grid: Grid,
    mesh: Any,
    *,
    window_len: int,
    score_len: int,
    block_size: Optional[int],
    keep_tokens: bool,
) -> tuple[Any, Any]:
  """``score_stream``'s evaluation step and its jitted per-batch sums
  (params, bank, batch) -> (bank, sums); the sums are unused for a kind with
  an external memory (``external.run_stream`` jits the step itself)."""
  step = evaluation.make_eval_step(
      model,
      window_len=window_len,
      score_len=score_len,
      kind=grid.kind,
      long_sizes=grid.long_sizes,
      temperatures=grid.temperatures,
      thetas=grid.thetas,
      lambdas=grid.lambdas,
      block_size=block_size,
      extra_settings=grid.extra_settings(),
  )
  num_points = len(grid.points())

  def reduced(params, bank, batch):
    bank, out = step(params, bank, batch)
    w = out["weights"]
    res = {"lm": -jnp.sum(out["lm"] * w), "tokens": jnp.sum(w)}
    if num_points:
      logp = out[grid.kind].reshape((num_points,) + w.shape)
      res["grid"] = -jnp.sum(logp * w, axis=(1, 2))
      if keep_tokens:
        res["grid_tok"] = logp
    if keep_tokens:
      res.update(
          lm_tok=out["lm"],
          w_tok=w,
          tgt_tok=out["targets"],
          pos_tok=out["positions"],
      )
    return bank, res

  fn = sharding_lib.under_mesh(jax.jit(reduced, donate_argnums=(1,)), mesh)
  return step, fn


def score_stream(
    model: Any,
    params: Any,
    tokens: np.ndarray,
    grid: Grid,
    *,
    window_len: int,
    score_len: int,
    batch_size: int,
    mesh: Any,
    unit: str,
    block_size: Optional[int] = 1024,
    max_windows: int = 0,
    keep_tokens: bool = False,
    desc: str = "memory eval",
    external: Any = None,
    compiled: Optional[dict[Any, Any]] = None,
) -> dict[str, Any]:
  """Scores a token stream with every setting of ``grid`` in one pass.

  Args:
    model: the TransformerLM.
    params: its parameters.
    tokens: [N] int token stream of the split.
    grid: the settings.
    window_len: T.
    score_len: S.
    batch_size: windows per batch (rounded up to the data-parallel size).
    mesh: device mesh.
    unit: 'ppl' or 'bpc'.
    block_size: blockwise block of the long-memory sums.
    max_windows: only the first this many windows of ``eval_windows`` (0 = all).
    keep_tokens: also return per-prediction log-probabilities.
    desc: name for the progress lines.
    external: for a kind with an external memory, its
      ``memory.external.ExternalSearch`` (searcher, k, pipelining).
    compiled: a dict that keeps the jitted scoring functions between calls
      with the same model, grid and shapes (e.g. one stream per document);
      None: built for this call only.

  Returns:
    {'plain': summary without memory, 'grid': [setting + summary, ...]} where
    a summary is {'nll', 'tokens', 'ppl' | 'bpc'}; with keep_tokens also
    'targets' [P], 'lm_logprob' [P] and 'grid_logprob' [G, P] in stream order.
  """
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  batch_size = int(math.ceil(batch_size / dp) * dp)
  tokens = truncate_windows(
      np.asarray(tokens), window_len, score_len, max_windows
  )
  key = (id(model), id(mesh), grid, window_len, score_len, block_size,
         keep_tokens)  # fmt: skip
  if compiled is None or key not in compiled:
    fns = _scoring_fns(
        model, grid, mesh, window_len=window_len, score_len=score_len,
        block_size=block_size, keep_tokens=keep_tokens,
    )  # fmt: skip
    if compiled is not None:
      compiled[key] = (model, mesh) + fns  # keeps the ids of the key alive
  step, fn = compiled[key][2:] if compiled is not None else fns
  if grid.memory().external_metric:
    from memjax.eval import external as external_lib  # pylint: disable=g-import-not-at-top

    fetched, start = external_lib.run_stream(
        step, model, params, tokens, grid, external,
        window_len=window_len, score_len=score_len, batch_size=batch_size,
        mesh=mesh, keep_tokens=keep_tokens, desc=desc, compiled=compiled,
    )  # fmt: skip
    return summarize_stream(fetched, grid, unit, keep_tokens, desc, start)
  bank = evaluation.init_bank(step.capacity, model.d_model)
  num_windows = len(
      streams.memory_eval_windows(
          max(len(tokens) - 1, 0), window_len, score_len
      )
  )
  num_batches = -(-num_windows // batch_size)
  start = time.time()
  pending = []
  last_report = start
  for i, batch in enumerate(
      streams.memory_eval_batches(tokens, window_len, score_len, batch_size)
  ):
    bank, res = fn(params, bank, sharding_lib.put_global_batch(batch, mesh))
    pending.append(res)
    if time.time() - last_report > 30 and i + 1 < num_batches:
      jax.block_until_ready(res)
      last_report = time.time()
      console.info(
          "%s: batch %d/%d, %.0fs",
          desc,
          i + 1,
          num_batches,
          last_report - start,
      )
  fetched = jax.device_get(pending)
  return summarize_stream(fetched, grid, unit, keep_tokens, desc, start)


def summarize_stream(
    fetched: list[dict[str, Any]],
    grid: Grid,
    unit: str,
    keep_tokens: bool,
    desc: str,
    start: float,
) -> dict[str, Any]:
  """``score_stream``'s results from its per-batch sums (host arrays)."""
  count = float(sum(r["tokens"] for r in fetched))
  out: dict[str, Any] = {
      "plain": evaluate.summarize(
          float(sum(r["lm"] for r in fetched)), count, unit
      )
  }
  points = grid.points()
  if points:
    sums = np.sum([r["grid"] for r in fetched], axis=0)
    out["grid"] = [
        dict(p, **evaluate.summarize(float(s), count, unit))
        for p, s in zip(points, sums)
    ]
  if keep_tokens:
    w = np.concatenate([r["w_tok"].reshape(-1) for r in fetched]) > 0
    pos = np.concatenate([r["pos_tok"].reshape(-1) for r in fetched])[w]
    order = np.argsort(pos, kind="stable")
    out["positions"] = pos[order]
    out["targets"] = np.concatenate(
        [r["tgt_tok"].reshape(-1) for r in fetched]
    )[w][order]
    out["lm_logprob"] = np.concatenate(
        [r["lm_tok"].reshape(-1) for r in fetched]
    )[w][order]
    if points:
      g = np.concatenate(
          [r["grid_tok"].reshape(len(points), -1) for r in fetched], axis=1
      )
      out["grid_logprob"] = g[:, w][:, order]
  best = min(out.get("grid", []), key=lambda r: r["nll"], default=None)
  console.info(
      "%s: %d predictions, %d settings in %.1fs; plain %s=%.4f%s",
      desc,
      int(count),
      len(points),
      time.time() - start,
      unit,
      out["plain"][unit],
      f", best {unit}={best[unit]:.4f} at {setting_str(best)}" if best else "",
  )
  return out


def setting_str(r: dict[str, Any]) -> str:
  keys = ("long_mem_tokens", "temperature", "cache_theta", "cache_lambda")
  keys += tuple(EXTRA_AXES.values())
  return ", ".join(f"{k}={r[k]:g}" for k in keys if k in r)


# ----------------------------------------------------------------------------
# Restoring a model
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class Loaded:
  """A model restored for evaluation, with its data."""

  config: ml_collections.ConfigDict
  mesh: Any
  model: Any
  params: Any
  vocab_size: int
  train_tokens: Optional[np.ndarray]
  splits: dict[str, np.ndarray]
  unit: str
  step: int
  source: str
  workdir: str = ""  # where the mode writes its results


def load(
    config: ml_collections.ConfigDict,
    workdir: str,
    source: Optional[str] = None,
    splits: Sequence[str] = ("valid", "test"),
    train: bool = False,
) -> Loaded:
  """Restores ``source`` (default: ``workdir``, else ``train.init_from``)
  through ``memjax.experiment.load`` and reads the splits (and the training
  split when ``train``); the training batcher is never built.

  Raises:
    errors.MissingRunError: nothing to evaluate.
    errors.CheckpointMismatchError: ``config`` describes another model.
  """
  if source is None:
    source = experiment.source_of(config, workdir)
  restored = experiment.load(source, config=config)
  corpus = experiment.load_corpus(config, workdir, tuple(splits), train=train)
  os.makedirs(workdir, exist_ok=True)  # Results go here.
  console.info(
      "evaluating %s step %d with memories", restored.path, restored.step
  )
  return Loaded(
      config,
      restored.mesh,
      restored.model,
      restored.params,
      restored.vocab_size,
      corpus.train.tokens if train else None,
      {s: corpus.splits[s].tokens for s in splits},
      restored.unit,
      restored.step,
      restored.path,
      workdir,
  )


def grid_of(setting: dict[str, Any]) -> Grid:
  """The one-point grid of a setting ({'kind', 'long_mem_tokens', ...}) as
  ``tune.json`` stores it under 'best'."""
  return Grid(
      kind=setting["kind"],
      long_sizes=(int(setting.get("long_mem_tokens", 0)),),
      temperatures=(float(setting.get("temperature", 1.0)),),
      thetas=(float(setting.get("cache_theta", 0.0)),),
      lambdas=(float(setting.get("cache_lambda", 0.0)),),
      **{f: (float(setting.get(key, 0.0)),) for f, key in EXTRA_AXES.items()},
  )
