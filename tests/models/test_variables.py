"""A model's variables besides its parameters (``memjax.models.variables``).

Model state end to end: an encoder whose memory's query has a BatchNorm
trains, resumes bit-identically, evaluates with its running statistics and
exports; a causal model takes the BatchNorm only with the switch that names
the leak. Module statistics: LaMemo's mean alpha per layer, from the layer to
the train step, TensorBoard, train_log.jsonl and evaluation."""

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

import memjax
from configs import pkm_wt103
from memjax import build
from memjax import dispatch
from memjax.models import transformer
from memjax.models import variables as model_vars
from memjax.run import init_from
from memjax.run import loop
from memjax.run import restore as restore_lib
from memjax.run import step as step_lib
from tests import conftest
from tests import shared_runs
from tests.models import helpers

QUERY_NORM = ("batch_stats", "layer_0", "ffn", "memory", "query_norm")


class _Interrupt(Exception):
  pass


def _norm(tree):
  for key in QUERY_NORM:
    tree = tree[key]
  return {k: np.asarray(v) for k, v in tree.items()}


def test_as_variables_and_params_of():
  params = {"layer_0": {"w": 1}}
  assert model_vars.as_variables(params) == {"params": params}
  both = model_vars.as_variables(params, {"batch_stats": {"m": 2}})
  assert both == {"params": params, "batch_stats": {"m": 2}}
  assert model_vars.as_variables(both) == both
  assert model_vars.params_of(both) is params
  assert model_vars.params_of(params) is params


@pytest.fixture(scope="module")
def bert_runs(tmp_path_factory):
  """configs/pkm_bert.py:resm_smoke (query BatchNorm, the default) on the
  tiny corpus, 4 steps straight and 2 + resume + 2, and the states after
  each update (``hook(step, state)``) of the straight run."""
  root = tmp_path_factory.mktemp("bert_state")
  config = shared_runs.bert_smoke_config(
      "resm_smoke", shared_runs.core_data("encoder", root)
  )
  config.train.num_steps = 4
  config.train.checkpoint_every = 2
  config.train.log_every = 1
  states = {}

  def keep(step, state):
    states[step] = jax.device_get(state.model_state)

  straight = str(root / "straight")
  results = loop.train_and_evaluate(
      build.build(config, straight), hooks=(keep,)
  )

  def stop_after_2(step, state):
    del state
    if step == 2:
      raise _Interrupt()

  parts = str(root / "parts")
  with pytest.raises(_Interrupt):
    loop.train_and_evaluate(build.build(config, parts), hooks=(stop_after_2,))
  memjax.train(config, parts)
  return straight, parts, states, results


def test_the_query_batchnorm_trains_and_resumes_bit_identically(bert_runs):
  straight, parts, states, _ = bert_runs
  assert (
      dispatch.restore(straight).settings.model.feed_forward_options[
          "query_norm"
      ]
      == "batch"
  )
  # Every update moves the running statistics.
  seen = [_norm(states[s])["mean"] for s in (1, 2, 3, 4)]
  for a, b in zip(seen, seen[1:]):
    assert np.abs(a - b).max() > 0
  a, b = dispatch.restore(straight), dispatch.restore(parts)
  assert a.step == b.step == 4
  for x, y in ((a.params, b.params), (a.model_state, b.model_state)):
    jax.tree.map(np.testing.assert_array_equal, x, y)
  np.testing.assert_array_equal(_norm(a.model_state)["mean"], seen[-1])


def test_evaluation_reads_the_statistics_and_leaves_them(bert_runs, tmp_path):
  straight, _, states, results = bert_runs
  restored = dispatch.restore(straight)
  before = _norm(restored.model_state)
  # The final evaluation ran after step 4 and the checkpoint kept step 4's.
  np.testing.assert_array_equal(before["mean"], _norm(states[4])["mean"])
  # Evaluation uses the running averages: other statistics, other scores.
  from memjax.eval import scorer as scorer_lib  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  tokens = rng.integers(5, 200, size=(4, 16)).astype(np.int32)
  batch = {
      "inputs": tokens,
      "targets": tokens,
      "weights": np.ones(tokens.shape, np.float32),
  }
  scorer = scorer_lib.scorer_for(restored.scoring())
  got = scorer.rows(restored.variables, batch, batch_size=4)
  moved = jax.tree.map(lambda x: x + 3.0, restored.model_state)
  other = scorer.rows(
      model_vars.as_variables(restored.params, moved), batch, batch_size=4
  )
  # (A 4-step model's memory adds little: a small, not a rounding, gap.)
  assert abs(float(got["nll_sum"]) - float(other["nll_sum"])) > 1e-3
  again = scorer.rows(restored.variables, batch, batch_size=4)
  assert again["nll_sum"] == got["nll_sum"]  # deterministic, nothing moved
  np.testing.assert_array_equal(
      _norm(restored.model_state)["mean"], before["mean"]
  )
  assert results["valid"]  # the final evaluation ran with them
  # Exported and loaded: the same statistics and scores.
  out = restore_lib.export(restored, str(tmp_path / "export"))
  loaded = dispatch.restore(out)
  assert loaded.kind == "export"
  jax.tree.map(
      np.testing.assert_array_equal, loaded.model_state, restored.model_state
  )
  exported = scorer_lib.scorer_for(loaded.scoring()).rows(
      loaded.variables, batch, batch_size=4
  )
  assert exported["nll_sum"] == pytest.approx(got["nll_sum"], rel=1e-6)
  # memjax.load (the API) scores the run and its export alike.
  text = ["the game was released in japan in the same year"]
  a = memjax.load(straight).score(text, mask_prob=0.5)
  b = memjax.load(out).score(text, mask_prob=0.5)
  assert a["tokens"] > 0 and a["nll"] == pytest.approx(b["nll"], rel=1e-6)


def test_init_from_takes_the_statistics_of_a_run_and_of_its_export(
    bert_runs, tmp_path
):
  straight, _, _, _ = bert_runs
  restored = dispatch.restore(straight)
  out = restore_lib.export(restored, str(tmp_path / "export"))
  run = restored.run
  model = run.model(restored.vocab_size)
  tx, _ = run.optimizer()
  sample = {"inputs": np.zeros((2, 8), np.int32)}
  for source in (straight, out):
    state, shardings = step_lib.create_state(
        model,
        tx,
        run.mesh,
        sample,
        jax.random.PRNGKey(5),
        run.state_collections(),
    )
    np.testing.assert_array_equal(_norm(state.model_state)["mean"], 0.0)
    state = init_from.init_params_from(run, source, state, shardings)
    jax.tree.map(
        np.testing.assert_array_equal,
        jax.device_get(state.model_state),
        restored.model_state,
    )


def test_batchnorm_in_a_causal_model_is_one_line_with_exit_2(tmp_path):
  proc = conftest.run_main(
      "--config=configs/pkm_wt103.py:pkm_smoke",
      "--config.model.feed_forward_options.query_norm=batch",
      f"--workdir={tmp_path / 'run'}",
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "allow_batchnorm_future_leak=True" in lines[0]
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "run").exists()


def test_the_leak_switch_trains_a_causal_model_with_batch_stats(tmp_path):
  config = pkm_wt103.get_config("pkm_smoke")
  opts = config.model.feed_forward_options
  opts.query_norm = "batch"
  opts.allow_batchnorm_future_leak = True
  config.train.num_steps = 2
  config.train.eval_every = 0
  config.train.checkpoint_every = 2
  config.eval.max_windows = 4
  config.eval.splits = ("valid",)
  memjax.train(config, str(tmp_path / "run"))
  restored = dispatch.restore(str(tmp_path / "run"))
  stats_ = jax.tree.leaves(restored.model_state)
  assert stats_ and any(np.abs(np.asarray(x)).max() > 0 for x in stats_)


V, T, M = 64, 4, 4

LAYERS = ("layer_0/attention/alpha", "layer_1/attention/alpha")


class _Reporter(nn.Module):

  @nn.compact
  def __call__(self, x):
    model_vars.report_mean(self, "x", x, x > 0)
    model_vars.report_mean(self, "x", jnp.full((2,), 10.0))  # Adds up.
    return x


def test_reports_add_up_and_cost_nothing_unless_collected():
  x = jnp.array([1.0, -1.0, 3.0])
  out, sums = model_vars.apply(_Reporter(), {}, x)
  np.testing.assert_allclose(sums["x"], [24.0, 4.0])
  assert model_vars.means(sums) == {"x": 6.0}
  assert model_vars.means({"x": np.zeros((3, 2))}) == {}  # Nothing counted.
  np.testing.assert_allclose(
      model_vars.total({"x": jnp.ones((3, 2))})["x"], [3, 3]
  )
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
  _, sums = model_vars.apply(model, {"params": params}, x, x, memory=memory)
  assert model_vars.means(sums) == {}  # An empty memory has no valid slot.
  out = model.apply({"params": params}, x, x, memory=memory)
  memory = model.reset_memory(out.memory, jnp.array([False, True, False]))
  _, state = model.apply(
      {"params": params},
      x,
      x,
      memory=memory,
      mutable=["intermediates", model_vars.COLLECTION],
  )
  sums = model_vars.flatten(state[model_vars.COLLECTION])
  assert sorted(sums) == list(LAYERS)
  valid = np.asarray(memory[0].valid, np.float64)  # [B, M]
  for i, name in enumerate(LAYERS):
    alpha = state["intermediates"][f"layer_{i}"]["attention"]["alpha"][0]
    want = np.einsum("bmh,bm->", alpha, valid) / (valid.sum() * 2)
    assert model_vars.means(sums)[name] == pytest.approx(want, rel=1e-5)
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
  report = model_vars.SumReport(
      collection="x",
      key="x",
      metrics=lambda s: {"used": float(np.mean(s["reads"] > 0))},
  )
  assert model_vars.module_sums({}) == {}
  assert report.by_module(sums) == {
      "layer_1/ffn/memory": {"used": pytest.approx(2 / 3)},
      "layer_2/ffn/memory": {"used": pytest.approx(1 / 3)},
  }
  assert report.by_module({}) == {}
