"""The recurrent models' mode settings."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Extrapolate:
  """``config.extrapolate``: --mode=extrapolate, memories of m x the
  segment length (LaMemo, Figure 5).

  Attributes:
    ratios: the multiples m.
    split: the split scored.
    max_segments: segments per lane (0 = the whole split).
  """

  SECTION: ClassVar[str] = "extrapolate"
  ratios: tuple[int, ...] = tuple(range(1, 11))
  split: str = "valid"
  max_segments: int = 0


@dataclasses.dataclass(frozen=True)
class Analyze:
  """``config.analyze``: --mode=analyze, alpha by layer and memory slot,
  attention by distance.

  Attributes:
    split: the split read.
    num_segments: segments per lane averaged over.
  """

  SECTION: ClassVar[str] = "analyze"
  split: str = "valid"
  num_segments: int = 100
