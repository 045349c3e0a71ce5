"""TRIME's settings: the keys it adds to the config and their defaults.

The flat keys sit in the loss, data and evaluation-memory sections
(``--config.loss.memory``, ``--config.data.bm25_k``,
``--config.eval_memory.temperature``), so command lines name them as they
name the engine's; ``pack`` is a section of its own.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Bm25:
  """``config.data``'s BM25 batching (Algorithm 1, ``data.batching='bm25'``).

  Attributes:
    bm25_k: hits per query.
    bm25_seed: the seed of the chain's random starts.
    bm25_stopwords: drop English stop words (word corpora).
  """

  SECTION: ClassVar[str] = "data"
  bm25_k: int = 20
  bm25_seed: int = 0
  bm25_stopwords: bool = False


@dataclasses.dataclass(frozen=True)
class Pack:
  """``config.pack``: --mode=pack.

  Attributes:
    runner: '' packs in this process (bm25_order's .npy cache); a Beam
      runner (DirectRunner, DataflowRunner, FlinkRunner, SparkRunner)
      writes the packed SeqIO task's cache instead (pack_beam).
    workers: local processes of the DirectRunner.
    options: flags passed to Beam, e.g. '--project=p --region=r
      --temp_location=gs://b/tmp'.
  """

  SECTION: ClassVar[str] = "pack"
  runner: str = ""
  workers: int = 2
  options: str = ""


@dataclasses.dataclass(frozen=True)
class TrimeLoss:
  """``config.loss``'s TRIME objective (``loss.name='trime'``).

  Attributes:
    memory: the training memory: local | long | external.
    lm_warmup_fraction: the plain-LM warm-up share of the updates.
    local_hide_prob: the probability of hiding the local memory for a
      step (external).
    stop_gradient_memory: no gradient into the memory keys (an ablation).
    block_size: keys per block of the blockwise loss.
  """

  SECTION: ClassVar[str] = "loss"
  memory: str = "local"
  lm_warmup_fraction: float = 0.05
  local_hide_prob: float = 0.9
  stop_gradient_memory: bool = False
  block_size: int = 1024


@dataclasses.dataclass(frozen=True)
class TrimeEvalMemory:
  """``config.eval_memory``'s evaluation memory 'trime' (Eq. 6).

  Attributes:
    temperature: tau, which divides the memory logits only.
    temperature_grid: the values ``--mode=tune`` tries.
  """

  SECTION: ClassVar[str] = "eval_memory"
  temperature: float = 1.0
  temperature_grid: tuple[float, ...] = (
      0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0,
  )  # fmt: skip


SETTINGS = (Bm25, Pack, TrimeLoss, TrimeEvalMemory)
# --mode=memsweep (Figure 3): TRIME's memory against the cache.
DEFAULTS = {"eval_memory.sweep_kinds": ("trime", "cache")}
