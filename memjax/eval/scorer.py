"""``scorer_for(run)``: how a run is scored, decided in one place.

* A model that carries memory (Transformer-XL, LaMemo) is scored over whole
  streams in lanes with its memory carried (``streams.StreamScorer``).
* With an evaluation memory (a ``memory_grid.Grid`` or a setting such as
  ``tune.json`` stores it), sliding windows with the memory's sums over
  M_local, M_long and an external datastore (``memory_grid.MemoryScorer``).
* Otherwise the model alone on sliding windows (``windows.WindowScorer``).

Every mode, task, demo and ``memjax.load(...).score`` scores through the
scorer this returns; every scorer also runs the model over given rows
(``rows.Scorer.rows``: masked windows, sentences, retrieval windows).
"""

from __future__ import annotations

from typing import Any, Union

from memjax import errors
from memjax.eval import grid as grid_lib
from memjax.io import paths
from memjax.eval import memory_grid
from memjax.eval import rows
from memjax.eval import streams
from memjax.eval import windows

Memory = Union[None, grid_lib.Grid, dict[str, Any]]


def scorer_for(
    scoring: rows.Scoring,
    memory: Memory = None,
    *,
    workdir: str = "",
    external: Any = None,
) -> rows.Scorer:
  """The scorer of a model (see the module docstring).

  Args:
    scoring: the model and its settings (``memjax.run.spec.Run.scoring``,
      or a restored run's ``scoring()``).
    memory: None or kind 'none': no evaluation memory; a setting
      ({'kind', 'long_mem_tokens', <axis keys>...}) or a grid: score with it.
    workdir: where the datastore of an external memory is.
    external: the external memory's ``ExternalSearch`` (else opened from
      the datastore when first needed).

  Raises:
    errors.ConfigError: an evaluation memory for a model that carries its
      own.
  """
  if isinstance(memory, dict):
    memory = grid_lib.grid_of(memory, scoring.memories)
  grid = memory
  if scoring.model.carries_memory():
    if grid is not None and grid.memory.uses_memory:
      raise errors.ConfigError(
          f"evaluation memory {grid.kind!r} reads sliding windows; this "
          "model carries its own memory (scored with it already): set "
          "eval_memory.kind to 'none'"
      )
    return streams.StreamScorer(scoring)
  if grid is None or not grid.memory.uses_memory:
    return windows.WindowScorer(scoring)
  return memory_grid.MemoryScorer(
      scoring, grid, workdir=workdir, external=external
  )


def memory_setting(scoring: rows.Scoring) -> dict[str, Any]:
  """The evaluation memory of a restored run: ``tune.json``'s choice (in
  ``scoring.path``), else the settings' ``eval_memory``; {'kind': 'none'}
  for a model that carries its own memory or has none configured."""
  em = scoring.memory
  tuned = paths.join(scoring.path, "tune.json")
  if scoring.model.carries_memory():
    return {"kind": "none"}
  if paths.isfile(tuned):
    t = paths.read_json(tuned)
    return {"kind": t["kind"], **t["best"], "source": "tune.json"}
  if em.kind == "none":
    return {"kind": "none"}
  memory = scoring.memories.get(em.kind)
  return {
      "kind": em.kind,
      "long_mem_tokens": int(em.long_mem_tokens),
      **{a.key: a.value(scoring.sections) for a in memory.axes},
      "source": "config",
  }
