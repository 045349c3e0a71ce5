"""Evaluation with testing memories: the memeval, tune, memsweep and buckets modes.

    python -m memjax.main --config=configs/trime_wt103.py:trime_long_demo \
        --workdir=runs/trime_long --mode=tune

Each mode restores the latest checkpoint of ``--workdir`` (or of
``train.init_from`` when the workdir has none), scores splits with the
sliding windows of ``eval.window_len`` / ``eval.score_len`` and the memories
of ``config.eval_memory`` (see ``memjax/memory/evaluation.py``), and writes
its results into the workdir:

* ``memeval``: the configured setting (kind, N, tau or lambda/theta) on
  ``eval.splits`` -> ``memeval.json``.
* ``tune``: a grid search on valid (tau for TRIME, lambda x theta for the
  cache, times the sizes of ``eval_memory.long_mem_grid``), then test at the
  best setting -> ``tune.json``, ``tune.csv``.
* ``memsweep``: valid perplexity against the long-term memory size
  (``eval_memory.sweep_tokens``), each size at its best tau (TRIME) or
  (lambda, theta) (cache; on the checkpoint of ``eval_memory.cache_workdir``
  if given), Figure 3 style -> ``memsweep.csv``, ``memsweep.json``,
  ``memsweep.png``.
* ``buckets``: perplexity by frequency bucket (Table 14) of the plain model
  and of the model with its memory (the tuned setting of ``tune.json`` when
  present, else the configured one) -> ``buckets.json``, ``buckets.md``.

Every mode reports the plain model (no memory) alongside, from the same pass.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import os
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from memjax import checkpointing
from memjax import console
from memjax import evaluate
from memjax import sharding as sharding_lib
from memjax import train
from memjax.data import sources
from memjax.data import streams
from memjax.data import tasks
from memjax.memory import evaluation

# ----------------------------------------------------------------------------
# Grids
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Grid:
  """The settings one pass scores.

  Attributes:
    kind: 'none', 'trime' or 'cache'.
    long_sizes: long-term memory sizes N (0 = M_local only).
    temperatures: tau values (trime).
    thetas: cache inverse temperatures.
    lambdas: cache interpolation weights.
  """

  kind: str
  long_sizes: tuple[int, ...] = (0,)
  temperatures: tuple[float, ...] = (1.0,)
  thetas: tuple[float, ...] = ()
  lambdas: tuple[float, ...] = ()

  def points(self) -> list[dict[str, Any]]:
    """Settings in the order of the step's flattened grid axes."""
    if self.kind == "trime":
      return [
          {"long_mem_tokens": n, "temperature": t}
          for n, t in itertools.product(self.long_sizes, self.temperatures)
      ]
    if self.kind == "cache":
      return [
          {"long_mem_tokens": n, "cache_theta": th, "cache_lambda": la}
          for n, th, la in itertools.product(
              self.long_sizes, self.thetas, self.lambdas
          )
      ]
    return []


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
  )


# ----------------------------------------------------------------------------
# Scoring a stream
# ----------------------------------------------------------------------------


def truncate_windows(
    tokens: np.ndarray, window_len: int, score_len: int, max_windows: int
) -> np.ndarray:
  """The prefix of ``tokens`` that the first ``max_windows`` windows of
  ``streams.eval_windows`` cover (all of it for 0), as memjax.evaluate does."""
  if not max_windows:
    return tokens
  windows = streams.eval_windows(len(tokens) - 1, window_len, score_len)
  last = windows[min(max_windows, len(windows)) - 1]
  return tokens[: int(last[0]) + int(last[1]) + 1]


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
  )
  num_points = len(grid.points())

  def reduced(params, bank, batch):
    bank, out = step(params, bank, batch)
    w = out["weights"]
    res = {"lm": -jnp.sum(out["lm"] * w), "tokens": jnp.sum(w)}
    if grid.kind != "none":
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
      f", best {unit}={best[unit]:.4f} at {_setting(best)}" if best else "",
  )
  return out


def _setting(r: dict[str, Any]) -> str:
  keys = ("long_mem_tokens", "temperature", "cache_theta", "cache_lambda")
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
  train_tokens: np.ndarray
  splits: dict[str, np.ndarray]
  unit: str
  step: int
  source: str


def _checkpoint_dir(workdir: str) -> Optional[str]:
  d = os.path.join(workdir, "checkpoints")
  if os.path.isdir(d) and any(s.isdigit() for s in os.listdir(d)):
    return d
  return None


def load(
    config: ml_collections.ConfigDict,
    workdir: str,
    source: Optional[str] = None,
    splits: Sequence[str] = ("valid", "test"),
) -> Loaded:
  """Restores the parameters of ``source`` (default: ``workdir``, then
  ``train.init_from``) for ``config``'s model and reads the splits.

  Raises:
    FileNotFoundError: no checkpoint to evaluate.
    checkpointing.CheckpointMismatchError: a checkpoint of another model.
  """
  os.makedirs(workdir, exist_ok=True)
  mesh = sharding_lib.make_mesh(config.mesh.to_dict())
  dcfg = config.data
  data_dir = dcfg.data_dir or sources.default_data_dir(dcfg.corpus)
  cache_dir = dcfg.cache_dir or os.path.join(workdir, "cache")
  os.makedirs(cache_dir, exist_ok=True)
  train_stream = tasks.load_token_stream(
      dcfg.corpus, data_dir, "train", cache_dir
  )
  split_tokens = {
      s: tasks.load_token_stream(dcfg.corpus, data_dir, s, cache_dir).tokens
      for s in splits
  }
  vocab = train_stream.vocab_size
  model = train.build_model(config.model, vocab)
  ckpt_dir = None
  for cand in ([source] if source else [workdir, config.train.init_from]):
    if cand and _checkpoint_dir(cand):
      ckpt_dir = _checkpoint_dir(cand)
      break
  if ckpt_dir is None:
    raise FileNotFoundError(
        f"no checkpoint to evaluate in {source or workdir}"
        + ("" if source else " (nor in train.init_from)")
        + ": train first or pass --config.train.init_from=RUN_DIR"
    )
  checker = checkpointing.Checkpointer(
      ckpt_dir,
      keep=1,
      signature=train.model_signature(config, vocab),
      create=False,
  )
  step = checker.latest_step()
  checker.check_compatible(step)
  checker.close()
  sample = {
      "inputs": np.zeros((1, config.eval.window_len), np.int32),
      "targets": np.zeros((1, config.eval.window_len), np.int32),
  }
  state, shardings = train.create_state(
      model, optax.identity(), mesh, sample, jax.random.PRNGKey(0)
  )
  abstract = checkpointing.abstract_with_sharding(
      state.params, shardings.params
  )
  params, step = checkpointing.restore_params(ckpt_dir, abstract, step)
  console.info("evaluating %s step %d with memories", ckpt_dir, step)
  return Loaded(
      config,
      mesh,
      model,
      params,
      vocab,
      train_stream.tokens,
      split_tokens,
      evaluate.metric_unit(dcfg.corpus),
      int(step),
      os.path.dirname(ckpt_dir),
  )


def _score(
    loaded: Loaded,
    split: str,
    grid: Grid,
    keep_tokens: bool = False,
    desc: str = "",
) -> dict[str, Any]:
  c = loaded.config
  return score_stream(
      loaded.model,
      loaded.params,
      loaded.splits[split],
      grid,
      window_len=c.eval.window_len,
      score_len=c.eval.score_len,
      batch_size=c.eval_memory.batch_size,
      mesh=loaded.mesh,
      unit=loaded.unit,
      block_size=int(c.eval_memory.block_size) or None,
      max_windows=int(c.eval.max_windows),
      keep_tokens=keep_tokens,
      desc=desc or f"{grid.kind} {split}",
  )


def _write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def _check_kind(kind: str, allowed: Sequence[str]) -> None:
  if kind not in allowed:
    raise ValueError(
        f"eval_memory.kind must be one of {tuple(allowed)} here, "
        f"got {kind!r}"
    )


# ----------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------


def memeval(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Scores eval.splits with the configured memory (``--mode=memeval``)."""
  em = config.eval_memory
  _check_kind(em.kind, evaluation.KINDS)
  loaded = load(config, workdir, splits=tuple(config.eval.splits))
  grid = configured_grid(em)
  results: dict[str, Any] = {
      "mode": "memeval",
      "kind": em.kind,
      "metric": loaded.unit,
      "checkpoint": loaded.source,
      "step": loaded.step,
  }
  lines = []
  for split in config.eval.splits:
    r = _score(loaded, split, grid)
    memory = r["grid"][0] if r.get("grid") else r["plain"]
    results[split] = {"plain": r["plain"], "memory": memory}
    lines.append(
        f"{split}: {loaded.unit} {memory[loaded.unit]:.4f} with "
        f"{em.kind} memory ({_setting(memory) or 'none'}); without "
        f"memory {r['plain'][loaded.unit]:.4f}"
    )
  path = os.path.join(workdir, "memeval.json")
  _write_json(path, results)
  return {**results, "results_path": path, "summary_lines": lines}


def tune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Grid search on valid, test at the best setting (``--mode=tune``)."""
  em = config.eval_memory
  _check_kind(em.kind, ("trime", "cache"))
  loaded = load(config, workdir)
  unit = loaded.unit
  grid = tuning_grid(em, em.kind)
  valid = _score(loaded, "valid", grid, desc=f"tune {em.kind} valid")
  best = min(valid["grid"], key=lambda r: r["nll"])
  best_grid = Grid(
      kind=em.kind,
      long_sizes=(best["long_mem_tokens"],),
      temperatures=(best.get("temperature", 1.0),),
      thetas=(best.get("cache_theta", 0.0),),
      lambdas=(best.get("cache_lambda", 0.0),),
  )
  test = _score(loaded, "test", best_grid, desc=f"tune {em.kind} test")
  setting = {
      k: best[k]
      for k in ("long_mem_tokens", "temperature", "cache_theta", "cache_lambda")
      if k in best
  }
  results = {
      "mode": "tune",
      "kind": em.kind,
      "metric": unit,
      "checkpoint": loaded.source,
      "step": loaded.step,
      "best": setting,
      "valid": {"plain": valid["plain"], "memory": best},
      "test": {"plain": test["plain"], "memory": test["grid"][0]},
      "grid_valid": valid["grid"],
  }
  _write_json(os.path.join(workdir, "tune.json"), results)
  fields = list(setting) + ["nll", unit, "tokens"]
  with open(os.path.join(workdir, "tune.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for r in valid["grid"]:
      writer.writerow(r)
  lines = [
      f"tune {em.kind}: best on valid at {_setting(best)}",
      f"valid: {unit} {best[unit]:.4f} (without memory {valid['plain'][unit]:.4f})",
      f"test: {unit} {test['grid'][0][unit]:.4f} (without memory "
      f"{test['plain'][unit]:.4f})",
  ]
  return {
      **results,
      "results_path": os.path.join(workdir, "tune.json"),
      "summary_lines": lines,
  }


def memsweep(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Valid perplexity against the long-term memory size (``--mode=memsweep``)."""
  em = config.eval_memory
  sizes = tuple(sorted({int(n) for n in em.sweep_tokens}))
  if not sizes:
    raise ValueError("eval_memory.sweep_tokens is empty")
  rows = []
  loaded_self = None
  for kind in em.sweep_kinds:
    _check_kind(kind, ("trime", "cache"))
    source = (
        em.cache_workdir if (kind == "cache" and em.cache_workdir) else None
    )
    if source:
      loaded = load(config, workdir, source=source, splits=("valid",))
    else:
      loaded_self = loaded_self or load(config, workdir, splits=("valid",))
      loaded = loaded_self
    r = _score(
        loaded,
        "valid",
        tuning_grid(em, kind, sizes),
        desc=f"memsweep {kind} valid",
    )
    for n in sizes:
      best = min(
          (g for g in r["grid"] if g["long_mem_tokens"] == n),
          key=lambda g: g["nll"],
      )
      rows.append(
          {
              "kind": kind,
              "checkpoint": loaded.source,
              **best,
              "plain_" + loaded.unit: r["plain"][loaded.unit],
          }
      )
  unit = (loaded_self or loaded).unit
  fields = [
      "kind",
      "long_mem_tokens",
      unit,
      "nll",
      "temperature",
      "cache_theta",
      "cache_lambda",
      "plain_" + unit,
      "checkpoint",
  ]
  with open(os.path.join(workdir, "memsweep.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
      writer.writerow(row)
  _write_json(
      os.path.join(workdir, "memsweep.json"),
      {"mode": "memsweep", "metric": unit, "rows": rows},
  )
  plot_memsweep(rows, unit, os.path.join(workdir, "memsweep.png"))
  lines = [
      f"{r['kind']:6s} N={r['long_mem_tokens']:6d}  valid {unit} "
      f"{r[unit]:.4f}  ({_setting(r)})"
      for r in rows
  ]
  return {
      "mode": "memsweep",
      "rows": rows,
      "results_path": os.path.join(workdir, "memsweep.csv"),
      "summary_lines": lines,
  }


def plot_memsweep(rows: list[dict[str, Any]], unit: str, path: str) -> None:
  """Figure 3 style: valid perplexity against the long-term memory size."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  labels = {
      "trime": "TRIME (Eq. 6, tuned tau)",
      "cache": "continuous cache (tuned lambda, theta)",
  }
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for kind in dict.fromkeys(r["kind"] for r in rows):
    pts = sorted(
        (r["long_mem_tokens"], r[unit]) for r in rows if r["kind"] == kind
    )
    ax.plot(
        [p[0] for p in pts],
        [p[1] for p in pts],
        marker="o",
        label=labels.get(kind, kind),
    )
  ax.set_xlabel("long-term memory size (tokens)")
  ax.set_ylabel(f"valid {unit}")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def buckets(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Perplexity by frequency bucket on valid, Table 14 (``--mode=buckets``)."""
  from memjax.analysis import frequency  # pylint: disable=g-import-not-at-top

  em = config.eval_memory
  loaded = load(config, workdir, splits=("valid",))
  grid = configured_grid(em)
  tuned = os.path.join(workdir, "tune.json")
  if os.path.exists(tuned):
    with open(tuned) as f:
      t = json.load(f)
    if t.get("kind") == em.kind or em.kind == "none":
      grid = Grid(
          kind=t["kind"],
          long_sizes=(t["best"]["long_mem_tokens"],),
          temperatures=(t["best"].get("temperature", 1.0),),
          thetas=(t["best"].get("cache_theta", 0.0),),
          lambdas=(t["best"].get("cache_lambda", 0.0),),
      )
      console.info("buckets: using the tuned setting of %s", tuned)
  r = _score(loaded, "valid", grid, keep_tokens=True, desc="buckets valid")
  if em.bucket_counts == "valid":
    counts = np.bincount(loaded.splits["valid"], minlength=loaded.vocab_size)
  elif em.bucket_counts == "train":
    counts = np.bincount(loaded.train_tokens, minlength=loaded.vocab_size)
  else:
    raise ValueError(
        f"eval_memory.bucket_counts must be valid or train, got "
        f"{em.bucket_counts!r}"
    )
  edges = tuple(int(e) for e in em.bucket_edges)
  columns = {"no memory": r["lm_logprob"]}
  if r.get("grid_logprob") is not None:
    columns[f"{grid.kind} memory ({_setting(r['grid'][0])})"] = r[
        "grid_logprob"
    ][0]
  table = frequency.bucket_table(r["targets"], columns, counts, edges)
  results = {
      "mode": "buckets",
      "metric": "ppl",
      "counts_from": em.bucket_counts,
      "edges": list(edges),
      "checkpoint": loaded.source,
      "step": loaded.step,
      "name": config.name,
      "rows": table,
  }
  _write_json(os.path.join(workdir, "buckets.json"), results)
  md = frequency.markdown(table, title=config.name)
  with open(os.path.join(workdir, "buckets.md"), "w") as f:
    f.write(md + "\n")
  return {
      **results,
      "results_path": os.path.join(workdir, "buckets.md"),
      "summary_lines": md.splitlines(),
  }
