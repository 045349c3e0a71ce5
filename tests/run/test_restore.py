"""memjax.run.restore on a run that carries a recurrent memory."""

import os

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp

from memjax import build


def test_lamemo_run_restores_with_its_optimizer(lamemo_smoke_workdir):
  """The checkpoint's carried memory (batch-shaped, unknown without the
  corpus) no longer stops the optimiser state from being restored."""
  plain = build.load(lamemo_smoke_workdir)
  full = build.load(lamemo_smoke_workdir, with_optimizer=True)
  assert full.step == plain.step == 6
  for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(full.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Adam's step count and moments: 6 updates were applied.
  counts = [
      int(s.count)
      for s in jax.tree.leaves(
          full.opt_state,
          is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState),
      )
      if isinstance(s, optax.ScaleByAdamState)
  ]
  assert counts == [6]
  # The same arrays as orbax reads from the step with no target at all.
  raw = ocp.StandardCheckpointer().restore(
      os.path.join(lamemo_smoke_workdir, "checkpoints", "6", "state")
  )

  def fingerprint(tree):
    return sorted(
        (np.shape(x), float(np.sum(np.asarray(x, np.float64))))
        for x in jax.tree.leaves(tree)
    )

  assert len(fingerprint(raw["opt_state"])) > 2 * len(
      jax.tree.leaves(plain.params)
  )
  assert fingerprint(full.opt_state) == fingerprint(raw["opt_state"])
