"""Shared fixtures of the evaluation-memory tests."""

import jax
import numpy as np
import pytest

from memjax import sharding as sharding_lib


@pytest.fixture(scope="session")
def repetitive_setup():
  """A function (model, window) -> (model, params, tokens [49], one-device
  mesh) for a stream in which a 7-token phrase recurs, so that long-term
  and external memories hold positives."""
  return _repetitive_setup


def _repetitive_setup(model, window: int):
  rng = np.random.default_rng(0)
  phrase = rng.integers(3, 24, 7)
  tokens = np.concatenate(
      [phrase if i % 2 else rng.integers(3, 24, 7) for i in range(7)]
  ).astype(np.int32)
  # The premise of every test that uses it: the phrase recurs (at positions
  # 7, 21, 35), so a memory of earlier windows holds its continuations.
  starts = [
      i for i in range(len(tokens) - 6) if (tokens[i : i + 7] == phrase).all()
  ]
  assert starts[:3] == [7, 21, 35] and window < len(tokens), (starts, window)
  params = model.init(
      jax.random.PRNGKey(0), tokens[None, :window], tokens[None, 1 : window + 1]
  )["params"]
  one = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  return model, params, tokens, one
