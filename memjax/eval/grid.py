"""The settings one pass with an evaluation memory scores: a ``Grid``.

A grid names the memory kind (``eval_memory.kind``, one of the run's
evaluation memories), the long-term memory sizes N and the values of each
of the kind's axes; one pass of ``memory_grid.MemoryScorer`` scores every
combination. ``configured_grid``, ``tuning_grid`` and ``grid_of`` make
grids from the ``eval_memory`` values and from a setting as ``tune.json``
stores it; each looks the kind up in the memories it is given.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Mapping, Optional, Sequence

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.memory import evaluation

Memories = extend.Lookup[evaluation.EvalMemory]


@dataclasses.dataclass(frozen=True, init=False)
class Grid:
  """The settings one pass scores.

  Built as ``Grid("trime", memories.get("trime"), long_sizes=(0, 1024),
  temperatures=(1.0, 1.25))``: the keywords are the ``Axis.values`` of the
  kind's axes; an axis left out takes its default.

  Attributes:
    kind: the memory's name (``eval_memory.kind``).
    memory: the evaluation memory.
    long_sizes: long-term memory sizes N (0 = M_local only).
    settings: (axis values name, values) per axis of the kind, in its order.
  """

  kind: str
  memory: evaluation.EvalMemory = dataclasses.field(compare=False)
  long_sizes: tuple[int, ...]
  settings: tuple[tuple[str, tuple[float, ...]], ...]

  def __init__(
      self,
      kind: str,
      memory: evaluation.EvalMemory,
      long_sizes: Sequence[int] = (0,),
      **values: Any,
  ) -> None:
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
    object.__setattr__(self, "memory", memory)
    object.__setattr__(self, "long_sizes", tuple(int(n) for n in long_sizes))
    object.__setattr__(self, "settings", settings)

  def values(self) -> dict[str, tuple[float, ...]]:
    """{Axis.values: values}: the kind's ``Settings``."""
    return dict(self.settings)

  def axes(self) -> dict[str, tuple[Any, ...]]:
    """The values of each axis by key, in the step's grid order (N first)."""
    out: dict[str, tuple[Any, ...]] = {"long_mem_tokens": self.long_sizes}
    for axis, (_, values) in zip(self.memory.axes, self.settings):
      out[axis.key] = values
    return out

  def points(self) -> list[dict[str, Any]]:
    """Settings in the order of the step's flattened grid axes (none for a
    kind without memory)."""
    if not self.memory.uses_memory:
      return []
    axes = self.axes()
    return [
        dict(zip(axes, values)) for values in itertools.product(*axes.values())
    ]


def make(
    memories: Memories,
    kind: str,
    long_sizes: Sequence[int] = (0,),
    **values: Any,
) -> Grid:
  """The grid of the memory named ``kind`` (ConfigError for an unknown
  one)."""
  return Grid(kind, memories.get(kind), long_sizes, **values)


def configured_grid(s: settings_lib.Settings, memories: Memories) -> Grid:
  """The single setting the run's settings configure: ``eval_memory.kind``
  at ``long_mem_tokens``, each axis at its section's value."""
  em = s.eval_memory
  memory = memories.get(em.kind)
  return Grid(
      em.kind,
      memory,
      (int(em.long_mem_tokens),),
      **{a.values: (a.value(s.sections),) for a in memory.axes},
  )


def tuning_grid(
    s: settings_lib.Settings,
    memories: Memories,
    kind: str,
    long_sizes: Optional[Sequence[int]] = None,
) -> Grid:
  """The tuning grid the run's settings configure for ``kind``: each
  axis's grid key (an empty one keeps the configured value), the sizes
  ``eval_memory.long_mem_grid`` (else ``long_mem_tokens``) unless
  ``long_sizes`` is given."""
  em = s.eval_memory
  sizes = (
      long_sizes
      if long_sizes is not None
      else (em.long_mem_grid or (em.long_mem_tokens,))
  )
  memory = memories.get(kind)
  return Grid(
      kind,
      memory,
      sizes,
      **{
          a.values: a.grid(s.sections) or (a.value(s.sections),)
          for a in memory.axes
      },
  )


def grid_of(setting: Mapping[str, Any], memories: Memories) -> Grid:
  """The one-point grid of a setting ({'kind', 'long_mem_tokens', ...}) as
  ``tune.json`` stores it under 'best'."""
  memory = memories.get(setting["kind"])
  return Grid(
      setting["kind"],
      memory,
      (int(setting.get("long_mem_tokens", 0)),),
      **{
          a.values: (float(setting[a.key]),)
          for a in memory.axes
          if a.key in setting
      },
  )


def setting_keys(memories: Memories) -> tuple[str, ...]:
  """Every setting name of a result, N first, then every kind's axes."""
  keys = ["long_mem_tokens"]
  for _, memory in memories.items():
    for axis in memory.axes:
      if axis.key not in keys:
        keys.append(axis.key)
  return tuple(keys)


def setting_str(r: Mapping[str, Any], memories: Memories) -> str:
  """'long_mem_tokens=1024, temperature=1.25' of a result's settings."""
  return ", ".join(f"{k}={r[k]:g}" for k in setting_keys(memories) if k in r)
