"""TRIME's settings: its own sections, the keys it adds and their defaults.

``trime`` holds the objective's, the BM25 batches' and the evaluation
memory's keys (``--config.trime.memory``, ``--config.trime.bm25_k``,
``--config.trime.temperature``); ``pack`` is --mode=pack's. Before, the
keys sat in the engine's loss, data and eval_memory sections: ``RENAMES``
reads configs and runs written with those keys.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Trime:
  """``config.trime``: the TRIME objective (``loss.name='trime'``), its BM25
  batches (Algorithm 1, ``data.batching='bm25'``) and its evaluation
  memory 'trime' (Eq. 6).

  Attributes:
    memory: the training memory: local | long | external.
    lm_warmup_fraction: the plain-LM warm-up share of the updates.
    local_hide_prob: the probability of hiding the local memory for a
      step (external).
    stop_gradient_memory: no gradient into the memory keys (an ablation).
    block_size: keys per block of the blockwise loss.
    bm25_k: hits per query.
    bm25_seed: the seed of the chain's random starts.
    bm25_stopwords: drop English stop words (word corpora).
    temperature: tau, which divides the evaluation memory's logits only.
    temperature_grid: the values ``--mode=tune`` tries.
  """

  SECTION: ClassVar[str] = "trime"
  memory: str = "local"
  lm_warmup_fraction: float = 0.05
  local_hide_prob: float = 0.9
  stop_gradient_memory: bool = False
  block_size: int = 1024
  bm25_k: int = 20
  bm25_seed: int = 0
  bm25_stopwords: bool = False
  temperature: float = 1.0
  temperature_grid: tuple[float, ...] = (
      0.6,
      0.8,
      1.0,
      1.25,
      1.5,
      2.0,
      2.5,
      3.0,
  )


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


SETTINGS = (Trime, Pack)
# --mode=memsweep (Figure 3): TRIME's memory against the cache.
DEFAULTS = {"eval_memory.sweep_kinds": ("trime", "cache")}
# Keys that moved into ``trime`` from the engine's sections.
RENAMES = {
    **{
        f"loss.{k}": f"trime.{k}"
        for k in (
            "memory",
            "lm_warmup_fraction",
            "local_hide_prob",
            "stop_gradient_memory",
            "block_size",
        )
    },
    **{
        f"data.{k}": f"trime.{k}"
        for k in ("bm25_k", "bm25_seed", "bm25_stopwords")
    },
    **{
        f"eval_memory.{k}": f"trime.{k}"
        for k in ("temperature", "temperature_grid")
    },
}
