"""The continuous cache's settings (``--config.eval_memory.cache_lambda``
and so on)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class CacheEvalMemory:
  """``config.eval_memory``'s continuous cache ('cache').

  Attributes:
    cache_lambda: the interpolation weight.
    cache_theta: the inverse temperature (no 1/sqrt(d)).
    cache_lambda_grid, cache_theta_grid: the values ``--mode=tune`` tries.
    cache_workdir: --mode=memsweep: the run whose checkpoint the cache
      uses ('' = this one).
  """

  SECTION: ClassVar[str] = "eval_memory"
  cache_lambda: float = 0.1
  cache_theta: float = 0.05
  cache_lambda_grid: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
  cache_theta_grid: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
  cache_workdir: str = ""
