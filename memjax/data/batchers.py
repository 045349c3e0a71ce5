"""Training batchers by name: 'random' and 'consecutive'.

Every batcher registers a factory in ``memjax.registry.BATCHERS`` under the
name ``data.batching`` picks: ``make(config, train, cache_dir) -> batcher``
with the experiment config, the training ``tasks.TokenStream`` and the run's
cache directory. A batcher's ``batch(step)`` is a pure function of the step
(see ``memjax.data.streams``). The TRIME batchers 'blocks' and 'bm25'
register in ``memjax.methods.trime.packing``.
"""

from __future__ import annotations

from typing import Any, Callable

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


# The batch arrays of a batcher, known from the config alone:
# {name: (shape, dtype name)}; ``--mode=plan`` compiles the train step for
# them without reading data.
BatchShapes = dict[str, tuple[tuple[int, ...], str]]
ShapesFn = Callable[[ml_collections.ConfigDict, int], BatchShapes]


def with_shapes(shapes: ShapesFn) -> Callable[[Any], Any]:
  """Declares a batcher factory's ``batch_shapes(config, devices)``: the
  arrays of its batches on ``devices`` devices, without data."""

  def wrap(factory):
    factory.batch_shapes = shapes
    return factory

  return wrap


def segment_shapes(
    config: ml_collections.ConfigDict, devices: int
) -> BatchShapes:
  """'inputs', 'targets' [B, L] int32 (B = data.batch_size, L = seq_len)."""
  del devices
  b, length = int(config.data.batch_size), int(config.data.seq_len)
  return {"inputs": ((b, length), "int32"), "targets": ((b, length), "int32")}


def lane_shapes(config: ml_collections.ConfigDict, devices: int) -> BatchShapes:
  """``segment_shapes`` with 'lane_id' [B] int32 and 'reset' [lanes] bool."""
  out = segment_shapes(config, devices)
  out["lane_id"] = ((int(config.data.batch_size),), "int32")
  out["reset"] = ((lanes_of(config),), "bool")
  return out


@registry.BATCHERS.register("random")
@with_shapes(segment_shapes)
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
@with_shapes(lane_shapes)
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
