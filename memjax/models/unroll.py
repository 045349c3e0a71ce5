"""A switch that fully unrolls the train step's loops while it is traced.

XLA's cost analysis counts the body of a loop once, whatever its trip
count, and the train step loops (``lax.scan``) over micro-batches, segments,
softmax chunks and memory blocks. ``--mode=plan`` traces the step inside
``unrolled()`` so that each of these scans passes ``unroll=length`` and the
lowered program holds every iteration: its FLOP count is then the step's.
Training never sets the switch (unrolled loops compile slowly and hold
more temporaries).
"""

from __future__ import annotations

import contextlib
import contextvars

_UNROLL = contextvars.ContextVar("memjax_unroll_scans", default=False)


@contextlib.contextmanager
def unrolled():
  """Within the block, ``factor(n)`` is ``n``: scans traced here unroll."""
  token = _UNROLL.set(True)
  try:
    yield
  finally:
    _UNROLL.reset(token)


def factor(length: int) -> int:
  """The ``unroll`` of a scan of ``length`` steps: all of them inside
  ``unrolled()``, else 1 (an ordinary loop)."""
  return max(int(length), 1) if _UNROLL.get() else 1
