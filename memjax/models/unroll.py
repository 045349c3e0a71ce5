"""A switch that fully unrolls the train step's loops while it is traced.

XLA's cost analysis counts the body of a loop once, whatever its trip
count, and the train step loops (``lax.scan``) over micro-batches, segments,
scanned layers, softmax chunks and memory blocks. Inside ``unrolled()``
each of these scans passes ``unroll=length``, so the lowered program holds
every iteration and XLA's own count is the step's. ``--mode=plan`` counts
the looping program's trip counts instead (``memjax.modes.hlo_flops``:
unrolled programs compile slowly and hold more temporaries); this switch
builds the reference that count is tested against. Training never sets it.
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
