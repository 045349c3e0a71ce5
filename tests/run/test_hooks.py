"""Step hooks (memjax.run.hooks): schedule, state saved with checkpoints and
restored on resume, files in the workdir, config errors."""

import json
import os

import jax
import ml_collections
import pytest

import memjax
from configs import trime_wt103
from memjax import build
from memjax import errors
from memjax import extend
from memjax.checkpoints import checkpointing
from memjax.io import paths
from memjax.run import hooks
from memjax.run import loop

STARTS = []  # The state each CountCalls instance started from.


class CountCalls(hooks.StepHook):
  """Counts its calls and the steps they came at; writes them to a file."""

  def start(self):
    STARTS.append(json.loads(json.dumps(self.state)))

  def __call__(self, step, params):
    assert jax.tree.leaves(params)
    self.state["calls"] = self.state.get("calls", 0) + 1
    self.state["steps"] = self.state.get("steps", []) + [step]
    if self.ctx.is_chief:
      path = os.path.join(self.ctx.workdir, "count_calls.json")
      paths.write_json(path, dict(self.state, every=self.ctx.options["every"]))


# The hook joins as a method defined outside memjax would.
METHOD = extend.Method(
    name="test_hooks", hooks={"test_count_calls": CountCalls}
)


@pytest.fixture(autouse=True)
def count_calls_hook():
  """``test_count_calls`` declared while a test runs."""
  extend.add(METHOD)
  try:
    yield
  finally:
    extend.remove(METHOD.name)


class _Interrupt(Exception):
  pass


def _config():
  config = trime_wt103.get_config("smoke")
  config.train.num_steps = 8
  config.train.log_every = 4
  config.train.checkpoint_every = 4
  config.train.eval_every = 0
  config.eval.max_windows = 4
  config.train.hooks = ("test_count_calls",)
  config.train.hook_options.test_count_calls = ml_collections.ConfigDict(
      {"every": 3}
  )
  return config


def _saved_hooks(workdir, step):
  ckpt = checkpointing.Checkpointer(
      os.path.join(workdir, "checkpoints"), keep=3, signature={}, create=False
  )
  try:
    return ckpt.read_data(step)["hooks"]["test_count_calls"]
  finally:
    ckpt.close()


def test_hook_state_survives_an_interrupted_run(tmp_path):
  config = _config()
  workdir = str(tmp_path / "run")
  seen = {}

  def stop_after_7(step, state):
    if step == 7:
      with open(os.path.join(workdir, "count_calls.json")) as f:
        seen.update(json.load(f))
      raise _Interrupt()

  STARTS.clear()
  with pytest.raises(_Interrupt):
    loop.train_and_evaluate(build.build(config, workdir), hooks=(stop_after_7,))
  # Called at steps 3 and 6; the checkpoint of step 4 holds the first call.
  assert seen == {"calls": 2, "steps": [3, 6], "every": 3}
  assert _saved_hooks(workdir, 4) == {"calls": 1, "steps": [3]}
  memjax.train(config, workdir)
  # Resumed from step 4: the call at 6 is made again, once; none at 8.
  assert STARTS == [{}, {"calls": 1, "steps": [3]}]
  assert _saved_hooks(workdir, 8) == {"calls": 2, "steps": [3, 6]}
  with open(os.path.join(workdir, "count_calls.json")) as f:
    assert json.load(f)["calls"] == 2


@pytest.mark.parametrize(
    "names,options,needle",
    [
        (("nope",), {}, "unknown step hook 'nope'"),
        (("test_count_calls",), {"every": 0}, "every must be a positive"),
        (("test_count_calls",), {"every": 1.5}, "every must be a positive"),
        (("test_count_calls",) * 2, {}, "lists a hook twice"),
    ],
)
def test_bad_hook_config_is_refused_before_anything_is_written(
    tmp_path, names, options, needle
):
  config = _config()
  config.train.hooks = names
  config.train.hook_options.test_count_calls = ml_collections.ConfigDict(
      options
  )
  workdir = str(tmp_path / "run")
  with pytest.raises(errors.ConfigError, match=needle):
    memjax.train(config, workdir)
  assert not os.path.exists(workdir)


def test_every_defaults_to_one_and_hooks_run_in_order():
  calls = []

  class A(hooks.StepHook):

    def __call__(self, step, params):
      calls.append(("a", step))

  class B(A):

    def __call__(self, step, params):
      calls.append(("b", step))

  order = extend.Method(
      name="test_order", hooks={"test_order_a": A, "test_order_b": B}
  )
  extend.add(order)
  try:
    config = _config()
    config.train.hooks = ("test_order_b", "test_order_a")
    config.train.hook_options.test_order_a = ml_collections.ConfigDict(
        {"every": 2}
    )
    runner = build.build(config, "w").hooks({"test_order_a": {"x": 1}})
    for step in range(1, 5):
      runner.run(step, {})
    assert calls == [
        ("b", 1),
        ("b", 2),
        ("a", 2),
        ("b", 3),
        ("b", 4),
        ("a", 4),
    ]
    assert runner.states() == {"test_order_b": {}, "test_order_a": {"x": 1}}
    # A second hook of one name is refused.
    extend.add(
        extend.Method(name="test_order_again", hooks={"test_order_a": B})
    )
    with pytest.raises(ValueError, match="'test_order_a' is declared twice"):
      build.parts()
  finally:
    extend.remove("test_order")
    extend.remove("test_order_again")
