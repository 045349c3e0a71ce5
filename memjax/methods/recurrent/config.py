"""The recurrent models' mode settings, added to ``memjax.config.base_config``."""

import ml_collections


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds ``extrapolate`` and ``analyze`` to the base config ``c``."""
  # --mode=extrapolate: memories of m x segment length (LaMemo, Figure 5).
  c.extrapolate = ml_collections.ConfigDict()
  c.extrapolate.ratios = tuple(range(1, 11))
  c.extrapolate.split = "valid"
  c.extrapolate.max_segments = 0  # segments per lane (0 = whole split)

  # --mode=analyze: alpha by layer and memory slot, attention by distance.
  c.analyze = ml_collections.ConfigDict()
  c.analyze.split = "valid"
  c.analyze.num_segments = 100  # segments per lane averaged over
