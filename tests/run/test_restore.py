"""memjax.run.restore on a run that carries a recurrent memory."""

import os

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp

from memjax import dispatch
from memjax.models import layer_layout
from memjax.run import step as step_lib


def test_lamemo_run_restores_with_its_optimizer(
    lamemo_smoke_workdir, monkeypatch
):
  """The checkpoint's carried memory (batch-shaped, unknown without the
  corpus) no longer stops the optimiser state from being restored; the
  restore's template is abstract (no train state is initialised for it)."""

  def no_fresh_state(*args, **kwargs):
    raise AssertionError("a train state was initialised to restore into")

  monkeypatch.setattr(step_lib, "create_state", no_fresh_state)
  plain = dispatch.restore(lamemo_smoke_workdir)
  full = dispatch.restore(lamemo_smoke_workdir, with_optimizer=True)
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


def _smoke_config(steps: int, scanned: bool):
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top

  c = trime_wt103.get_config("smoke")
  c.model.dropout = 0.0  # Dropout masks differ between the layouts.
  c.model.scan_layers = scanned
  c.train.num_steps, c.train.checkpoint_every = steps, 2
  c.train.eval_every, c.train.log_every = 0, 2
  # A schedule that does not depend on num_steps, so that each run can
  # be continued further (extend_schedule) with the updates unchanged.
  c.loss.name, c.optim.schedule, c.optim.warmup_steps = "lm", "constant", 0
  c.train.extend_schedule = True
  return c


def _params(workdir):
  restored = dispatch.restore(workdir)
  return restored.step, layer_layout.unstack_layers(restored.params)


def test_runs_resume_across_scanned_and_unscanned_layers(tmp_path):
  """Trained unscanned to step 2, then scanned to 4, then unscanned to 6:
  the same parameters as unscanned all the way (no dropout)."""
  import memjax  # pylint: disable=g-import-not-at-top

  straight, mixed = str(tmp_path / "straight"), str(tmp_path / "mixed")
  memjax.train(_smoke_config(4, False), straight)
  memjax.train(_smoke_config(2, False), mixed)
  memjax.train(_smoke_config(4, True), mixed)
  step, params = dispatch.restore(mixed).step, dispatch.restore(mixed).params
  assert step == 4 and "layer_0_to_1" in params
  for a, b in ((_params(straight), _params(mixed)),):
    assert a[0] == b[0] == 4
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5),
        a[1],
        b[1],
    )
  memjax.train(_smoke_config(6, False), mixed)
  memjax.train(_smoke_config(6, False), straight)
  assert "layer_0" in dispatch.restore(mixed).params
  a, b = _params(straight), _params(mixed)
  assert a[0] == b[0] == 6
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5),
      a[1],
      b[1],
  )
  # train.init_from into the scanned layout: one update at learning rate
  # 0 keeps exactly what was taken from the unscanned run.
  c = _smoke_config(1, True)
  c.train.init_from, c.optim.learning_rate = straight, 0.0
  taken = str(tmp_path / "taken")
  memjax.train(c, taken)
  assert "layer_0_to_1" in dispatch.restore(taken).params
  jax.tree.map(np.testing.assert_array_equal, _params(taken)[1], a[1])
  # An export of the scanned run loads into the unscanned model.
  memjax.run_mode("export", c, taken)
  plain = _smoke_config(1, False)
  exported = dispatch.restore(os.path.join(taken, "export"), config=plain)
  assert "layer_0" in exported.params and exported.kind == "export"
  jax.tree.map(np.testing.assert_array_equal, exported.params, a[1])
