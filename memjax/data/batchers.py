"""Training batchers by name: 'random' and 'consecutive'.

Every batcher registers a factory in ``memjax.registry.BATCHERS`` under the
name ``data.batching`` picks: ``make(config, train, cache_dir) -> batcher``
with the experiment config, the training ``tasks.TokenStream`` and the run's
cache directory. A batcher's ``batch(step)`` is a pure function of the step
(see ``memjax.data.streams``). The TRIME batchers 'blocks' and 'bm25'
register in ``memjax.methods.trime.packing``.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from memjax import errors
from memjax import registry
from memjax.data import streams


def lanes_of(config: ml_collections.ConfigDict) -> int:
  """Lanes per step, ``data.batch_size / data.segments_per_lane``.

  Raises:
    errors.ConfigError: the batch is not a whole number of lanes.
  """
  d = config.data
  m = int(d.segments_per_lane)
  if d.batch_size % m:
    raise errors.ConfigError(
        f"data.batch_size {d.batch_size} is not a multiple of "
        f"data.segments_per_lane {m}"
    )
  return d.batch_size // m


@registry.BATCHERS.register("random")
def random_batcher(
    config: ml_collections.ConfigDict, train: Any, cache_dir: str
) -> streams.RandomSegments:
  """Independent random segments (models without recurrence)."""
  del cache_dir
  d = config.data
  return streams.RandomSegments(
      train.tokens, d.seq_len, d.batch_size, seed=config.seed
  )


@registry.BATCHERS.register("consecutive")
def consecutive_batcher(
    config: ml_collections.ConfigDict, train: Any, cache_dir: str
) -> streams.ConsecutiveSegments:
  """Lanes that continue from step to step (recurrent memory), m
  consecutive segments of each lane per step."""
  del cache_dir
  d = config.data
  return streams.ConsecutiveSegments(
      train.tokens,
      d.seq_len,
      lanes=lanes_of(config),
      segments_per_lane=int(d.segments_per_lane),
      seed=config.seed,
      doc_starts=train.doc_starts,
  )
