"""The continuous cache's config keys, added to ``memjax.config.base_config``
(``--config.eval_memory.cache_lambda`` and so on)."""

import ml_collections


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds the cache's settings to the base config ``c``."""
  c.eval_memory.cache_lambda = 0.1  # interpolation weight
  c.eval_memory.cache_theta = 0.05  # inverse temperature (no 1/sqrt(d))
  c.eval_memory.cache_lambda_grid = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
  c.eval_memory.cache_theta_grid = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
  # --mode=memsweep: the run whose checkpoint the cache uses ("" = this one).
  c.eval_memory.cache_workdir = ""
