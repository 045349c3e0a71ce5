"""Fixtures of the API tests: counting the programs JAX lowers (one per new
shape of a jitted function; a program found in the persistent cache is
still lowered)."""

import contextlib

import jax
import numpy as np
import pytest

_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_counts = []


def _listen(event: str, duration: float, **kwargs) -> None:
  del duration, kwargs
  if event == _EVENT and _counts:
    _counts[-1] += 1


jax.monitoring.register_event_duration_secs_listener(_listen)


@contextlib.contextmanager
def _count_lowerings():
  """Yields a function returning the programs lowered so far inside."""
  _counts.append(0)
  box = [0]
  try:
    yield lambda: _counts[-1] if _counts else box[0]
  finally:
    box[0] = _counts.pop()


@pytest.fixture
def count_lowerings():
  """``with count_lowerings() as lowered:`` ... ``lowered()`` programs.

  Checks first that the counter counts: a new jitted function lowered
  inside it is exactly one program (were JAX to rename the event, every
  "no new program" test would pass with a count of 0).
  """
  with _count_lowerings() as lowered:
    jax.jit(lambda x: x * 3 + 1).lower(np.zeros(3, np.float32))
    assert lowered() == 1, "the lowering counter does not see JAX's event"
  return _count_lowerings
