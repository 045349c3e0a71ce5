"""Traces of chosen updates (train.profile_steps).

A real run's trace is checked with the preempted run of
tests/run/test_preemption.py, whose losses must match an untraced run.
"""

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax import settings as settings_lib
from memjax.run import profiling


def _config(steps):
  """The base config's ``train`` settings with ``profile_steps``."""
  c = config_lib.base_config()
  c.train.profile_steps = steps
  return settings_lib.read(settings_lib.Train, c.train)


@pytest.mark.parametrize("steps", [(0, 2), (3,), (1, 2, 3), (2.0, 1), (2, -1)])
def test_malformed_profile_steps_are_one_line(steps):
  c = config_lib.base_config()
  c.train.profile_steps = steps
  parts = build.parts()
  s = build.read(c, parts)
  with pytest.raises(errors.ConfigError, match="train.profile_steps must be"):
    build.check(s, parts)


def test_traces_only_the_chosen_updates_and_leaves_them_unchanged(tmp_path):
  update = jax.jit(lambda x, k: x * 1.5 + k)
  x = jnp.arange(4.0)
  trace = profiling.StepTrace(_config((2, 2)), str(tmp_path))
  started = []
  with trace:
    for step in range(1, 6):
      x = trace.run(step, update, x, float(step))
      started.append(trace.active)
  # Running: after update 2 only (3 is the last traced, then it stops).
  assert started == [False, True, False, False, False]
  assert (trace.started, trace.traced) == (2, 3)
  files = glob.glob(
      os.path.join(
          tmp_path, "profile", "plugins", "profile", "*", "*.xplane.pb"
      )
  )
  assert len(files) == 1 and os.path.getsize(files[0]) > 0
  # The updates' results: x_{n} = 1.5 x_{n-1} + n, by hand in NumPy.
  want = np.arange(4.0)
  for step in range(1, 6):
    want = want * 1.5 + step
  np.testing.assert_array_equal(np.asarray(x), want.astype(np.float32))


def test_a_run_that_stops_inside_the_traced_updates_still_writes(tmp_path):
  trace = profiling.StepTrace(_config((1, 10)), str(tmp_path))
  with pytest.raises(RuntimeError):
    with trace:
      trace.run(1, jax.jit(lambda x: x + 1), jnp.zeros(2))
      raise RuntimeError("stopped")
  assert not trace.active
  assert glob.glob(
      os.path.join(tmp_path, "profile", "**", "*.xplane.pb"), recursive=True
  )
