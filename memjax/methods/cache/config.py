"""The continuous cache's settings: its section ``cache``
(``--config.cache.cache_lambda`` and so on; they sat in ``eval_memory``
before, and ``RENAMES`` reads configs and runs written so)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class CacheEvalMemory:
  """``config.cache``: the evaluation memory 'cache', the continuous cache.

  Attributes:
    cache_lambda: the interpolation weight.
    cache_theta: the inverse temperature (no 1/sqrt(d)).
    cache_lambda_grid, cache_theta_grid: the values ``--mode=tune`` tries.
    cache_workdir: --mode=memsweep: the run whose checkpoint the cache
      uses ('' = this one).
  """

  SECTION: ClassVar[str] = "cache"
  cache_lambda: float = 0.1
  cache_theta: float = 0.05
  cache_lambda_grid: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
  cache_theta_grid: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
  cache_workdir: str = ""


# Keys that moved into ``cache`` from ``eval_memory``.
RENAMES = {
    f"eval_memory.{k}": f"cache.{k}"
    for k in (
        "cache_lambda",
        "cache_theta",
        "cache_lambda_grid",
        "cache_theta_grid",
        "cache_workdir",
    )
}
