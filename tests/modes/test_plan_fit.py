"""--mode=plan's proposals for a step that does not fit: the smallest
train.grad_accum whose compiled step fits, checked against the totals of
the steps compiled at each accumulation."""

import jax

from configs import trime_wt103
from memjax import build
from memjax.modes import plan_compile
from memjax.modes import plan_fit


def _run(batch_size: int = 32):
  c = trime_wt103.get_config("smoke")
  c.plan.devices = 8
  c.data.batch_size = batch_size
  return build.build(c, "plan")


def test_proposes_the_fewest_micro_batches_that_fit():
  run, devices = _run(), jax.devices()
  # Micro-batches of 32, 16 and 8 rows (8 = one row per device).
  totals = {
      a: plan_fit._total(plan_fit._with(run, a), devices)  # pylint: disable=protected-access
      for a in (1, 2, 4)
  }
  assert totals[1] > totals[2] > totals[4]
  usable = (totals[1] + totals[2]) / 2
  proposal = plan_fit.propose(run, devices, usable)
  assert proposal["overrides"] == ["--config.train.grad_accum=2"]
  assert proposal["micro_batch"] == 16
  assert proposal["total_bytes"] == totals[2] <= usable
  assert "grad_accum=2 (micro-batch 16 rows" in plan_fit.describe(
      "float32", proposal
  )
  # Nothing fits a byte: the line says what is left.
  none = plan_fit.propose(run, devices, 1.0)
  assert none["overrides"] is None and "mesh.fsdp" in none["reason"]
  assert plan_fit.describe("bfloat16", none).startswith(
      "bfloat16: does not fit; "
  )


def test_sharded_mesh_option_holds_an_eighth_of_the_state():
  # When rows run out, the proposal's last resort is the same eight
  # data-parallel devices on mesh.fsdp: each then holds an eighth of every
  # parameter and optimiser slot that divides (the rest stays whole).
  run, devices = _run(), jax.devices()
  options = plan_fit.mesh_options(run.settings, devices)
  assert options[-1] == (
      ("--config.mesh.data=1", "--config.mesh.fsdp=8"),
      {"data": 1, "fsdp": 8},
  )
  whole = plan_compile.build_step(run, devices)
  sharded = plan_compile.build_step(
      plan_fit._with(run, 1, options[-1][1]), devices  # pylint: disable=protected-access
  )
  params = jax.tree.leaves(sharded.args[0].params)
  split = sum(
      x.size for x in params if x.sharding.shard_shape(x.shape) != x.shape
  )
  kept = sum(x.size for x in params) - split
  assert split > 0
  assert sharded.state_bytes["params"] == 4 * (split // 8 + kept)
  assert whole.state_bytes["params"] == 4 * (split + kept)
  # The batch still splits over all eight devices.
  assert (
      plan_compile.data_parallel(
          plan_fit._with(run, 1, options[-1][1]).settings, devices  # pylint: disable=protected-access
      )
      == 8
  )
