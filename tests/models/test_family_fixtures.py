"""Runs, exports and outputs written by earlier code restore and match.

``tests/fixtures/families/<family>/`` holds, for each model family, a
two-step run (its checkpoints as the training loop wrote them), its export,
a fixed batch and the model's outputs on it, written by the code before
the package moved into ``memjax/methods/`` (the Transformer-XL and
relative-position fixtures by the code before its attention kinds shared
one core; ``make_family_fixtures.py``).
A renamed or swapped parameter can restore without any error (two
LayerNorms of one shape, say), so the outputs are compared, not only the
loading.
"""

import json
import os
import re
import sys

import numpy as np
import pytest

from memjax import dispatch

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures")
sys.path.insert(0, FIXTURES)

import make_family_fixtures  # pylint: disable=g-import-not-at-top,wrong-import-position

FAMILIES = make_family_fixtures.NAMES
# The sub-layers that code before signature version 3 named otherwise, by
# family fixture: today's blocks name them as the decoder LM's, and a
# restore hands back today's names (memjax/checkpoints/convert.py).
RENAMED = {
    "encoder_decoder": {"self_attention": "attention", "ln_self": "ln_attn"},
    "encoder_mlm": {"ln_attention": "ln_attn"},
    "encoder_classifier": {"ln_attention": "ln_attn"},
}
# A key right under a block in a key path: "['layer_0']['ln_attention']".
_UNDER_BLOCK = re.compile(r"(\['(?:layer|encoder|decoder)_\d+'\]\[')(\w+)('\])")


def _renames(family: str, root: str) -> dict[str, str]:
  """{old name: today's} of the sub-layers the fixture's code named
  otherwise ({} for fixtures written with today's names)."""
  with open(os.path.join(root, "export", "export.json")) as f:
    version = json.load(f)["signature"].get("signature_version", 1)
  return RENAMED.get(family, {}) if version < 3 else {}


def _today(key: str, renames: dict[str, str]) -> str:
  """A key path of the fixtures' layout, with today's sub-layer names."""
  return _UNDER_BLOCK.sub(
      lambda m: m.group(1) + renames.get(m.group(2), m.group(2)) + m.group(3),
      key,
  )


@pytest.mark.newest
@pytest.mark.parametrize("family", FAMILIES)
def test_run_and_export_restore_with_the_same_outputs(family):
  root = os.path.join(FIXTURES, "families", family)
  batch = dict(np.load(os.path.join(root, "batch.npz")))
  want = dict(np.load(os.path.join(root, "outputs.npz")))
  run = dispatch.restore(os.path.join(root, "run"))
  export = dispatch.restore(os.path.join(root, "export"))
  assert (run.kind, export.kind) == ("run", "export")
  # Run eagerly, as the fixtures were written: the outputs agree to the
  # last bits of float32 (a jitted program may fuse differently). The suite
  # compiles with XLA's elemental emitters (conftest.COMPILE_FLAGS), whose
  # exp, log and tanh differ in the last bits from the fusion emitters that
  # wrote the fixtures: 1.8e-6 at most (LaMemo's second segment, values up
  # to 11), against 9.5e-7 with the fusion emitters. A renamed or swapped
  # parameter moves them by 1e-3 or more.
  for restored in (run, export):
    got = make_family_fixtures.outputs_for(family, restored, batch)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
      np.testing.assert_allclose(
          got[key], value, rtol=0, atol=2e-6, err_msg=f"{restored.kind} {key}"
      )


@pytest.mark.newest
@pytest.mark.parametrize("family", make_family_fixtures.OPTIMIZER_STATES)
def test_optimizer_state_restores(family):
  """The optimiser state (parameter groups, lazy Adam's moments of the
  memory values) restores into today's optimiser, leaf by leaf, under
  today's sub-layer names."""
  root = os.path.join(FIXTURES, "families", family)
  restored = dispatch.restore(os.path.join(root, "run"), with_optimizer=True)
  assert restored.step == 2
  saved = dict(np.load(os.path.join(root, "opt_state.npz")))
  renames = _renames(family, root)
  want = {_today(k, renames): v for k, v in saved.items()}
  assert len(want) == len(saved)
  if renames:  # The fixture holds the old names.
    assert want.keys() != saved.keys()
  got = make_family_fixtures.leaves(restored.opt_state)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
