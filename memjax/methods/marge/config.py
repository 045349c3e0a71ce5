"""Modified MARGE's settings: its section ``marge``.

The keys sat in an undeclared ``data.marge`` dict before; ``RENAMES`` reads
configs and runs written so.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Marge:
  """``config.marge``: the 'marge' batcher's retrieval.

  Attributes:
    same_doc_steps: the first updates draw sources from the query's own
      document (§5.4: poorly initialised clusters train slowly).
    sub_batch: windows of one document per sub-batch during those updates.
    search: how sources are found: exact | scann.
  """

  SECTION: ClassVar[str] = "marge"
  same_doc_steps: int = 0
  sub_batch: int = 4
  search: str = "exact"


SETTINGS = (Marge,)
RENAMES = {"data.marge": "marge"}
