"""Runs, exports and outputs written by earlier code restore and match.

``tests/fixtures/families/<family>/`` holds, for each model family, a
two-step run (its checkpoints as the training loop wrote them), its export,
a fixed batch and the model's outputs on it, all written by the code before
the package moved into ``memjax/methods/`` (``make_family_fixtures.py``).
A renamed or swapped parameter can restore without any error (two
LayerNorms of one shape, say), so the outputs are compared, not only the
loading.
"""

import os
import sys

import numpy as np
import pytest

from memjax import experiment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures")
sys.path.insert(0, FIXTURES)

import make_family_fixtures  # pylint: disable=g-import-not-at-top,wrong-import-position

FAMILIES = (
    "decoder_pkm",
    "decoder_lamemo",
    "encoder_decoder",
    "encoder_mlm",
    "encoder_classifier",
    "marge",
)


@pytest.mark.parametrize("family", FAMILIES)
def test_run_and_export_restore_with_the_same_outputs(family):
  root = os.path.join(FIXTURES, "families", family)
  batch = dict(np.load(os.path.join(root, "batch.npz")))
  want = dict(np.load(os.path.join(root, "outputs.npz")))
  run = experiment.load(os.path.join(root, "run"))
  export = experiment.load(os.path.join(root, "export"))
  assert (run.kind, export.kind) == ("run", "export")
  # Run eagerly, as the fixtures were written: the outputs should agree to
  # the last bits (a jitted program may fuse differently, ~2e-6 apart).
  for restored in (run, export):
    got = make_family_fixtures.outputs_for(family, restored, batch)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
      np.testing.assert_allclose(
          got[key], value, rtol=0, atol=1e-6, err_msg=f"{restored.kind} {key}"
      )


@pytest.mark.parametrize("family", make_family_fixtures.OPTIMIZER_STATES)
def test_optimizer_state_restores(family):
  """The optimiser state (parameter groups, lazy Adam's moments of the
  memory values) restores into today's optimiser, leaf by leaf."""
  root = os.path.join(FIXTURES, "families", family)
  restored = experiment.load(os.path.join(root, "run"), with_optimizer=True)
  assert restored.step == 2
  want = dict(np.load(os.path.join(root, "opt_state.npz")))
  got = make_family_fixtures.leaves(restored.opt_state)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
