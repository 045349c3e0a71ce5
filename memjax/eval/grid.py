"""The settings one pass with an evaluation memory scores: a ``Grid``.

A grid names the memory kind (``registry.EVAL_MEMORIES``), the long-term
memory sizes N and the values of each of the kind's axes; one pass of
``memory_grid.MemoryScorer`` scores every combination. ``configured_grid``,
``tuning_grid`` and ``grid_of`` make grids from ``config.eval_memory`` and
from a setting as ``tune.json`` stores it.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Optional, Sequence

import ml_collections

from memjax import errors
from memjax import registry
from memjax.memory import evaluation


@dataclasses.dataclass(frozen=True, init=False)
class Grid:
  """The settings one pass scores.

  Built as ``Grid(kind, long_sizes=(0, 1024), temperatures=(1.0, 1.25))``:
  the keywords are the ``Axis.values`` of the kind's axes; an axis left out
  takes its default.

  Attributes:
    kind: a name in ``registry.EVAL_MEMORIES``.
    long_sizes: long-term memory sizes N (0 = M_local only).
    settings: (axis values name, values) per axis of the kind, in its order.
  """

  kind: str
  long_sizes: tuple[int, ...]
  settings: tuple[tuple[str, tuple[float, ...]], ...]

  def __init__(
      self, kind: str, long_sizes: Sequence[int] = (0,), **values: Any
  ) -> None:
    memory = registry.EVAL_MEMORIES.get(kind)
    names = [a.values for a in memory.axes]
    unknown = sorted(set(values) - set(names))
    if unknown:
      raise errors.ConfigError(
          f"evaluation memory {kind!r} has no setting {', '.join(unknown)}; "
          f"its settings: {', '.join(names) or 'none'}"
      )
    settings = tuple(
        (a.values, tuple(float(v) for v in values.get(a.values, a.default)))
        for a in memory.axes
    )
    object.__setattr__(self, "kind", kind)
    object.__setattr__(self, "long_sizes", tuple(int(n) for n in long_sizes))
    object.__setattr__(self, "settings", settings)

  def memory(self) -> evaluation.EvalMemory:
    """The evaluation memory of ``kind``."""
    return registry.EVAL_MEMORIES.get(self.kind)

  def values(self) -> dict[str, tuple[float, ...]]:
    """{Axis.values: values}: the kind's ``Settings``."""
    return dict(self.settings)

  def axes(self) -> dict[str, tuple[Any, ...]]:
    """The values of each axis by key, in the step's grid order (N first)."""
    out: dict[str, tuple[Any, ...]] = {"long_mem_tokens": self.long_sizes}
    for axis, (_, values) in zip(self.memory().axes, self.settings):
      out[axis.key] = values
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


def configured_grid(em: ml_collections.ConfigDict) -> Grid:
  """The single setting of ``config.eval_memory``."""
  memory = registry.EVAL_MEMORIES.get(em.kind)
  return Grid(
      em.kind,
      (int(em.long_mem_tokens),),
      **{a.values: (float(em[a.key]),) for a in memory.axes},
  )


def tuning_grid(
    em: ml_collections.ConfigDict,
    kind: str,
    long_sizes: Optional[Sequence[int]] = None,
) -> Grid:
  """The tuning grid of ``config.eval_memory`` for ``kind``."""
  sizes = (
      long_sizes
      if long_sizes is not None
      else (em.long_mem_grid or (em.long_mem_tokens,))
  )
  memory = registry.EVAL_MEMORIES.get(kind)
  # An empty tuning grid tunes nothing: the axis keeps its configured value.
  return Grid(
      kind,
      sizes,
      **{
          a.values: tuple(em[a.config_grid])
          or ((float(em[a.key]),) if a.key in em else ())
          for a in memory.axes
      },
  )


def grid_of(setting: dict[str, Any]) -> Grid:
  """The one-point grid of a setting ({'kind', 'long_mem_tokens', ...}) as
  ``tune.json`` stores it under 'best'."""
  memory = registry.EVAL_MEMORIES.get(setting["kind"])
  return Grid(
      setting["kind"],
      (int(setting.get("long_mem_tokens", 0)),),
      **{
          a.values: (float(setting[a.key]),)
          for a in memory.axes
          if a.key in setting
      },
  )


def setting_keys() -> tuple[str, ...]:
  """Every setting name of a result, N first, then every kind's axes."""
  keys = ["long_mem_tokens"]
  for name in registry.EVAL_MEMORIES.names():
    for axis in registry.EVAL_MEMORIES.get(name).axes:
      if axis.key not in keys:
        keys.append(axis.key)
  return tuple(keys)


def setting_str(r: dict[str, Any]) -> str:
  """'long_mem_tokens=1024, temperature=1.25' of a result's settings."""
  return ", ".join(f"{k}={r[k]:g}" for k in setting_keys() if k in r)
