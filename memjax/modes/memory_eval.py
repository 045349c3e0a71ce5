"""Evaluation with testing memories: the memeval, tune, memsweep and buckets modes.

    python -m memjax.main --config=configs/trime_wt103.py:trime_long_demo \
        --workdir=runs/trime_long --mode=tune

Each mode restores the latest checkpoint of ``--workdir`` (or of
``train.init_from`` when the workdir has none), scores splits with the
sliding windows of ``eval.window_len`` / ``eval.score_len`` and the memories
of ``config.eval_memory`` (see ``memjax/eval/memory_step.py``), and writes
its results into the workdir:

* ``memeval``: the configured setting (kind, N, tau or lambda/theta) on
  ``eval.splits`` -> ``memeval.json``.
* ``tune``: a grid search on valid (tau for TRIME, lambda x theta for the
  cache, times the sizes of ``eval_memory.long_mem_grid``), then test at the
  best setting -> ``tune.json``, ``tune.csv``.
* ``memsweep``: valid perplexity against the long-term memory size
  (``eval_memory.sweep_tokens``), each size at the best setting of each kind
  of ``eval_memory.sweep_kinds`` (a kind may be scored on another run's
  checkpoint: ``EvalMemory.sweep_source_key``, e.g. the cache's
  ``cache.cache_workdir``), Figure 3 style -> ``memsweep.csv``,
  ``memsweep.json``, ``memsweep.png``.
* ``buckets``: perplexity by frequency bucket (Table 14) of the plain model
  and of the model with its memory (the tuned setting of ``tune.json`` when
  present, else the configured one) -> ``buckets.json``, ``buckets.md``.

Every mode reports the plain model (no memory) alongside, from the same pass.
"""

from __future__ import annotations

import csv
from typing import Any

import numpy as np

from memjax import errors
from memjax.eval import grid as grid_lib
from memjax.eval import memory_grid
from memjax.io import console
from memjax.io import paths
from memjax.modes import frequency
from memjax.run import restore
from memjax.run import spec

Grid = grid_lib.Grid


def score_split(
    loaded: restore.Restored,
    split: str,
    grid: Grid,
    keep_tokens: bool = False,
    desc: str = "",
) -> dict[str, Any]:
  """``split`` of ``loaded`` scored with every setting of ``grid`` (the
  external memory of a kind that reads one opened from the run's
  datastore)."""
  scoring = loaded.scoring()
  scorer = memory_grid.MemoryScorer(scoring, grid, workdir=loaded.workdir)
  return scorer.score_grid(
      loaded.variables,
      loaded.splits[split],
      max_items=int(scoring.eval.max_windows),
      keep_tokens=keep_tokens,
      desc=desc or f"{grid.kind} {split}",
  )


def _write_json(path: str, obj: Any) -> None:
  paths.write_json(path, obj)


def _check_tunable(kind: str, memories: grid_lib.Memories) -> None:
  """Raises ConfigError unless ``kind`` is an evaluation memory with
  settings to tune (not 'none')."""
  if not memories.get(kind).uses_memory:
    tunable = tuple(k for k, m in memories.items() if m.uses_memory)
    raise errors.ConfigError(
        f"eval_memory.kind must be one of {tunable} here, got {kind!r}"
    )


# ----------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------


def memeval(run: spec.Run) -> dict[str, Any]:
  """Scores eval.splits with the configured memory (``--mode=memeval``)."""
  em, memories = run.settings.eval_memory, run.parts.eval_memories
  memories.get(em.kind)  # ConfigError for an unknown kind.
  splits = tuple(run.settings.eval.splits)
  loaded = restore.load_splits(run, splits=splits)
  grid = grid_lib.configured_grid(run.settings, memories)
  results: dict[str, Any] = {
      "mode": "memeval",
      "kind": em.kind,
      "metric": loaded.unit,
      "checkpoint": loaded.path,
      "step": loaded.step,
  }
  lines = []
  for split in splits:
    r = score_split(loaded, split, grid)
    memory = r["grid"][0] if r.get("grid") else r["plain"]
    results[split] = {"plain": r["plain"], "memory": memory}
    words = grid_lib.setting_str(memory, memories) or "none"
    lines.append(
        f"{split}: {loaded.unit} {memory[loaded.unit]:.4f} with "
        f"{em.kind} memory ({words}); without "
        f"memory {r['plain'][loaded.unit]:.4f}"
    )
  path = paths.join(run.workdir, "memeval.json")
  _write_json(path, results)
  return {**results, "results_path": path, "summary_lines": lines}


def _grid_key(grid: Grid, key: str) -> str:
  """The config key (section.key) of the tuning grid of setting ``key``:
  its axis's, in the section that declares it, or the memory size's."""
  for axis in grid.memory.axes:
    if axis.key == key:
      return f"{axis.section.SECTION}.{axis.config_grid}"
  return "eval_memory.long_mem_grid"


def grid_edges(grid: Grid, best: dict[str, Any]) -> dict[str, float]:
  """The settings of ``best`` that lie at the smallest or largest value of a
  grid axis with more than one value (the optimum may lie outside)."""
  axes = grid.axes()
  # The memory size last, as the warnings have always listed it.
  axes["long_mem_tokens"] = axes.pop("long_mem_tokens")
  out = {}
  for key, values in axes.items():
    if len(set(values)) > 1 and key in best:
      if best[key] in (min(values), max(values)):
        out[key] = best[key]
  return out


def tune(run: spec.Run) -> dict[str, Any]:
  """Grid search on valid, test at the best setting (``--mode=tune``)."""
  em, memories = run.settings.eval_memory, run.parts.eval_memories
  kind, workdir = em.kind, run.workdir
  _check_tunable(kind, memories)
  loaded = restore.load_splits(run)
  unit = loaded.unit
  grid = grid_lib.tuning_grid(run.settings, memories, kind)
  valid = score_split(loaded, "valid", grid, desc=f"tune {kind} valid")
  best = min(valid["grid"], key=lambda r: r["nll"])
  best_grid = grid_lib.grid_of({"kind": kind, **best}, memories)
  edges = grid_edges(grid, best)
  test = score_split(loaded, "test", best_grid, desc=f"tune {kind} test")
  setting = {k: best[k] for k in grid.axes() if k in best}
  results = {
      "mode": "tune",
      "kind": kind,
      "metric": unit,
      "checkpoint": loaded.path,
      "step": loaded.step,
      "best": setting,
      "valid": {"plain": valid["plain"], "memory": best},
      "test": {"plain": test["plain"], "memory": test["grid"][0]},
      "grid_valid": valid["grid"],
      "on_grid_edge": edges,
  }
  _write_json(paths.join(workdir, "tune.json"), results)
  fields = list(setting) + ["nll", unit, "tokens"]
  with paths.open(paths.join(workdir, "tune.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for r in valid["grid"]:
      writer.writerow(r)
  lines = [
      f"tune {kind}: best on valid at "
      f"{grid_lib.setting_str(best, memories)}",
      f"valid: {unit} {best[unit]:.4f} (without memory {valid['plain'][unit]:.4f})",
      f"test: {unit} {test['grid'][0][unit]:.4f} (without memory "
      f"{test['plain'][unit]:.4f})",
  ]
  for key, value in edges.items():
    warning = (
        f"the best {key} ({value:g}) lies on the edge of its grid; "
        f"widen {_grid_key(grid, key)} and tune again"
    )
    console.warn("%s", warning)
    lines.append("warning: " + warning)
  return {
      **results,
      "results_path": paths.join(workdir, "tune.json"),
      "summary_lines": lines,
  }


def memsweep(run: spec.Run) -> dict[str, Any]:
  """Valid perplexity against the long-term memory size (``--mode=memsweep``)."""
  em, memories = run.settings.eval_memory, run.parts.eval_memories
  workdir = run.workdir
  sizes = tuple(sorted({int(n) for n in em.sweep_tokens}))
  if not sizes:
    raise errors.ConfigError("eval_memory.sweep_tokens is empty")
  rows = []
  loaded_self = None
  for kind in em.sweep_kinds:
    _check_tunable(kind, memories)
    memory = memories.get(kind)
    source = None
    if memory.sweep_source_key:
      owner = run.settings.of(memory.sweep_source_section)
      source = getattr(owner, memory.sweep_source_key)
    if source:
      loaded = restore.load_splits(run, splits=("valid",), source=source)
    else:
      loaded_self = loaded_self or restore.load_splits(run, splits=("valid",))
      loaded = loaded_self
    r = score_split(
        loaded,
        "valid",
        grid_lib.tuning_grid(run.settings, memories, kind, sizes),
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
              "checkpoint": loaded.path,
              **best,
              "plain_" + loaded.unit: r["plain"][loaded.unit],
          }
      )
  unit = (loaded_self or loaded).unit
  axes = [a.key for kind in em.sweep_kinds for a in memories.get(kind).axes]
  fields = ["kind", "long_mem_tokens", unit, "nll"]
  fields += list(dict.fromkeys(axes)) + ["plain_" + unit, "checkpoint"]
  with paths.open(paths.join(workdir, "memsweep.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
      writer.writerow(row)
  _write_json(
      paths.join(workdir, "memsweep.json"),
      {"mode": "memsweep", "metric": unit, "rows": rows},
  )
  labels = {k: memories.get(k).label or k for k in em.sweep_kinds}
  plot_memsweep(rows, unit, paths.join(workdir, "memsweep.png"), labels)
  lines = [
      f"{r['kind']:6s} N={r['long_mem_tokens']:6d}  valid {unit} "
      f"{r[unit]:.4f}  ({grid_lib.setting_str(r, memories)})"
      for r in rows
  ]
  return {
      "mode": "memsweep",
      "rows": rows,
      "results_path": paths.join(workdir, "memsweep.csv"),
      "summary_lines": lines,
  }


def plot_memsweep(
    rows: list[dict[str, Any]], unit: str, path: str, labels: dict[str, str]
) -> None:
  """Figure 3 style: valid perplexity against the long-term memory size
  (``labels``: how the legend names each kind)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

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
  paths.savefig(fig, path, dpi=120)
  plt.close(fig)


def buckets(run: spec.Run) -> dict[str, Any]:
  """Perplexity by frequency bucket on valid, Table 14 (``--mode=buckets``)."""
  em, memories = run.settings.eval_memory, run.parts.eval_memories
  workdir, name = run.workdir, run.settings.name
  loaded = restore.load_splits(
      run, splits=("valid",), train=em.bucket_counts == "train"
  )
  grid = grid_lib.configured_grid(run.settings, memories)
  tuned = paths.join(workdir, "tune.json")
  if paths.exists(tuned):
    t = paths.read_json(tuned)
    if t.get("kind") == em.kind or em.kind == "none":
      grid = grid_lib.grid_of({"kind": t["kind"], **t["best"]}, memories)
      console.info("buckets: using the tuned setting of %s", tuned)
  r = score_split(loaded, "valid", grid, keep_tokens=True, desc="buckets valid")
  if em.bucket_counts == "valid":
    counts = np.bincount(loaded.splits["valid"], minlength=loaded.vocab_size)
  elif em.bucket_counts == "train":
    counts = np.bincount(loaded.train_tokens, minlength=loaded.vocab_size)
  else:
    raise errors.ConfigError(
        f"eval_memory.bucket_counts must be valid or train, got "
        f"{em.bucket_counts!r}"
    )
  edges = tuple(int(e) for e in em.bucket_edges)
  columns = {"no memory": r["lm_logprob"]}
  if r.get("grid_logprob") is not None:
    words = grid_lib.setting_str(r["grid"][0], memories)
    columns[f"{grid.kind} memory ({words})"] = r["grid_logprob"][0]
  table = frequency.bucket_table(r["targets"], columns, counts, edges)
  results = {
      "mode": "buckets",
      "metric": "ppl",
      "counts_from": em.bucket_counts,
      "edges": list(edges),
      "checkpoint": loaded.path,
      "step": loaded.step,
      "name": name,
      "rows": table,
  }
  _write_json(paths.join(workdir, "buckets.json"), results)
  md = frequency.markdown(table, title=name)
  with paths.open(paths.join(workdir, "buckets.md"), "w") as f:
    f.write(md + "\n")
  return {
      **results,
      "results_path": paths.join(workdir, "buckets.md"),
      "summary_lines": md.splitlines(),
  }
