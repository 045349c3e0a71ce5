"""Module statistics (memjax.models.stats): LaMemo's mean alpha per layer, from the
layer to the train step, TensorBoard, train_log.jsonl and evaluation."""

import glob
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from memjax.models import stats
from memjax.models import transformer
from tests.models import helpers

V, T, M = 64, 4, 4
LAYERS = ("layer_0/attention/alpha", "layer_1/attention/alpha")


class _Reporter(nn.Module):

  @nn.compact
  def __call__(self, x):
    stats.report_mean(self, "x", x, x > 0)
    stats.report_mean(self, "x", jnp.full((2,), 10.0))  # Adds up.
    return x


def test_reports_add_up_and_cost_nothing_unless_collected():
  x = jnp.array([1.0, -1.0, 3.0])
  out, sums = stats.apply(_Reporter(), {}, x)
  np.testing.assert_allclose(sums["x"], [24.0, 4.0])
  assert stats.means(sums) == {"x": 6.0}
  assert stats.means({"x": np.zeros((3, 2))}) == {}  # Nothing counted.
  np.testing.assert_allclose(stats.total({"x": jnp.ones((3, 2))})["x"], [3, 3])
  # Not mutable: no error, and the module's output is its input.
  np.testing.assert_array_equal(_Reporter().apply({}, x), x)


def test_lamemo_alpha_mean_is_the_mean_of_the_analysed_alpha():
  model = transformer.TransformerLM(
      cfg=helpers.tiny(
          V,
          num_layers=2,
          mem_len=M,
          attention="lamemo",
      )
  )
  x = jnp.asarray(np.random.default_rng(0).integers(0, V, (3, T)), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), x, x)["params"]
  memory = model.init_memory(3)
  _, sums = stats.apply(model, {"params": params}, x, x, memory=memory)
  assert stats.means(sums) == {}  # An empty memory has no valid slot.
  out = model.apply({"params": params}, x, x, memory=memory)
  memory = model.reset_memory(out.memory, jnp.array([False, True, False]))
  _, state = model.apply(
      {"params": params},
      x,
      x,
      memory=memory,
      mutable=["intermediates", stats.COLLECTION],
  )
  sums = stats.flatten(state[stats.COLLECTION])
  assert sorted(sums) == list(LAYERS)
  valid = np.asarray(memory[0].valid, np.float64)  # [B, M]
  for i, name in enumerate(LAYERS):
    alpha = state["intermediates"][f"layer_{i}"]["attention"]["alpha"][0]
    want = np.einsum("bmh,bm->", alpha, valid) / (valid.sum() * 2)
    assert stats.means(sums)[name] == pytest.approx(want, rel=1e-5)
    assert 0.0 < want < 1.0


def _scalars(workdir):
  acc = event_accumulator.EventAccumulator(
      workdir, size_guidance={event_accumulator.TENSORS: 0}
  )
  acc.Reload()
  out = {}
  for tag in acc.Tags()["tensors"]:  # CLU writes tf.summary v2 scalars.
    out[tag] = {
        e.step: float(tensor_util.make_ndarray(e.tensor_proto))
        for e in acc.Tensors(tag)
    }
  for tag in acc.Tags()["scalars"]:
    out[tag] = {e.step: e.value for e in acc.Scalars(tag)}
  return out


def test_lamemo_smoke_logs_mean_alpha_per_layer(lamemo_smoke_workdir):
  # 6 steps of two micro-batches, logged and evaluated at steps 3 and 6.
  workdir = lamemo_smoke_workdir
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)  # What the run wrote when it finished.
  assert glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
  scalars = _scalars(workdir)
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    log = [json.loads(line) for line in f]
  assert "aux" not in log[0]  # Step 1: the memory is still empty.
  for name in LAYERS:
    tb = scalars[f"train/aux/{name}"]
    assert sorted(tb) == [3, 6]
    per_step = [r["aux"][name] for r in log[1:]]
    assert len(per_step) == 5 and all(0.0 < a < 1.0 for a in per_step)
    assert 0.0 < tb[3] < 1.0 and 0.0 < tb[6] < 1.0
    assert min(per_step[2:]) <= tb[6] <= max(per_step[2:])
    # Evaluation collects it too: periodic, final and results.json.
    assert 0.0 < scalars[f"periodic_valid/aux/{name}"][3] < 1.0
    assert 0.0 < results["valid"][f"aux/{name}"] < 1.0
    assert scalars[f"valid/aux/{name}"][6] == pytest.approx(
        results["valid"][f"aux/{name}"], rel=1e-6
    )


def test_a_sum_report_groups_sums_by_module():
  sums = {
      "layer_1": {"ffn": {"memory": {"reads": np.array([1.0, 0.0, 3.0])}}},
      "layer_2": {"ffn": {"memory": {"reads": np.array([0.0, 0.0, 2.0])}}},
  }
  report = stats.SumReport(
      collection="x",
      key="x",
      metrics=lambda s: {"used": float(np.mean(s["reads"] > 0))},
  )
  assert stats.module_sums({}) == {}
  assert report.by_module(sums) == {
      "layer_1/ffn/memory": {"used": pytest.approx(2 / 3)},
      "layer_2/ffn/memory": {"used": pytest.approx(1 / 3)},
  }
  assert report.by_module({}) == {}
