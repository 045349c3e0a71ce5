"""Product-key memory's mode settings."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class MemoryUsage:
  """``config.memory_usage``: --mode=memory_usage, MU, top-1 MU, KL_u and
  KL_w of each product-key memory over held-out data, in windows of
  eval.window_len.

  Attributes:
    split: the split read.
    max_tokens: 0 = the whole split.
    staleness: also every kept checkpoint: the slots last used as top-1 at
      each (Figure 2).
    count: how reads u' and top-1s t' count: token = once per token (Kim &
      Jung's t'_i, the argmax of the weights summed over heads); head =
      every head's.
  """

  SECTION: ClassVar[str] = "memory_usage"
  split: str = "valid"
  max_tokens: int = 0
  staleness: bool = False
  count: str = "token"
