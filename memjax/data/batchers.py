"""Training batchers: 'random' and 'consecutive'.

A batcher is declared (``extend.Batcher``) under the name ``data.batching``
picks: ``make(settings, train, cache_dir) -> batcher`` with the run's
settings, the training ``tasks.TokenStream`` and the run's cache
directory, and ``shapes(settings, devices)``, its arrays known without
data. A batcher's ``batch(step)`` is a pure function of the step (see
``memjax.data.streams``). The methods declare theirs (TRIME's 'blocks' and
'bm25').
"""

from __future__ import annotations

from typing import Any

from memjax import errors
from memjax import settings as settings_lib
from memjax.data import streams

Settings = settings_lib.Settings


def lanes_of(d: settings_lib.Data) -> int:
  """Lanes per step, ``data.batch_size / data.segments_per_lane``.

  Raises:
    errors.ConfigError: the batch is not a whole number of lanes.
  """
  m = int(d.segments_per_lane)
  if d.batch_size % m:
    raise errors.ConfigError(
        f"data.batch_size {d.batch_size} is not a multiple of "
        f"data.segments_per_lane {m}"
    )
  return d.batch_size // m


# The batch arrays of a batcher, known from the settings alone:
# {name: (shape, dtype name)}; ``--mode=plan`` compiles the train step for
# them without reading data.
BatchShapes = dict[str, tuple[tuple[int, ...], str]]


def segment_shapes(s: Settings, devices: int) -> BatchShapes:
  """'inputs', 'targets' [B, L] int32 (B = data.batch_size, L = seq_len)."""
  del devices
  b, length = int(s.data.batch_size), int(s.data.seq_len)
  return {"inputs": ((b, length), "int32"), "targets": ((b, length), "int32")}


def lane_shapes(s: Settings, devices: int) -> BatchShapes:
  """``segment_shapes`` with 'lane_id' [B] int32 and 'reset' [lanes] bool."""
  out = segment_shapes(s, devices)
  out["lane_id"] = ((int(s.data.batch_size),), "int32")
  out["reset"] = ((lanes_of(s.data),), "bool")
  return out


def random_batcher(
    s: Settings, train: Any, cache_dir: str
) -> streams.RandomSegments:
  """Independent random segments (models without recurrence)."""
  del cache_dir
  d = s.data
  return streams.RandomSegments(
      train.tokens, d.seq_len, d.batch_size, seed=s.seed
  )


def consecutive_batcher(
    s: Settings, train: Any, cache_dir: str
) -> streams.ConsecutiveSegments:
  """Lanes that continue from step to step (recurrent memory), m
  consecutive segments of each lane per step."""
  del cache_dir
  d = s.data
  return streams.ConsecutiveSegments(
      train.tokens,
      d.seq_len,
      lanes=lanes_of(d),
      segments_per_lane=int(d.segments_per_lane),
      seed=s.seed,
      doc_starts=train.doc_starts,
  )
