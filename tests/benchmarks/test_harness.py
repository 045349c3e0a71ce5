"""The benchmark harness's pure parts: overrides, statistics, rounds."""

from __future__ import annotations

import argparse
import json
import platform

import pytest

from benchmarks import harness
from memjax import config as base


@pytest.fixture
def cfg():
  return base.base_config()


@pytest.mark.parametrize(
    "override, expected",
    [
        ("model.remat=False", False),
        ("model.remat=True", True),
        ("model.remat=false", False),
        ("model.remat=0", False),
        ("model.remat=1", True),
    ],
)
def test_booleans_mean_what_they_say(cfg, override, expected):
  cfg.model.remat = not expected
  harness.apply_overrides(cfg, [override])
  assert cfg.model.remat is expected


def test_ints_floats_strings(cfg):
  harness.apply_overrides(
      cfg,
      [
          "model.d_model=64",
          "optim.learning_rate=1e-3",
          "trime.lm_warmup_fraction=0",
          "model.dtype=bfloat16",
      ],
  )
  assert cfg.model.d_model == 64 and isinstance(cfg.model.d_model, int)
  assert cfg.optim.learning_rate == pytest.approx(1e-3)
  assert cfg.trime.lm_warmup_fraction == 0.0
  assert isinstance(cfg.trime.lm_warmup_fraction, float)
  assert cfg.model.dtype == "bfloat16"


@pytest.mark.parametrize(
    "value, expected",
    [("(10, 20)", (10, 20)), ("(10,20,30)", (10, 20, 30)), ("()", ())],
)
def test_tuples(cfg, value, expected):
  harness.apply_overrides(cfg, [f"model.cutoffs={value}"])
  assert cfg.model.cutoffs == expected


def test_later_override_wins(cfg):
  harness.apply_overrides(cfg, ["model.num_layers=2", "model.num_layers=3"])
  assert cfg.model.num_layers == 3


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.no_such_key=1", "model.no_such_key"),
        ("nope.remat=True", "nope.remat"),
        ("model.remat.deeper=True", "model.remat.deeper"),
    ],
)
def test_unknown_key_is_an_error_naming_it(cfg, override, key):
  before = cfg.to_dict()
  with pytest.raises(harness.ConfigError, match=f"unknown config key '{key}'"):
    harness.apply_overrides(cfg, ["model.d_model=64", override])
  assert cfg.to_dict() == before  # Checked before anything is applied.


@pytest.mark.parametrize(
    "override", ["model.d_model=abc", "model.remat=maybe", "model.remat"]
)
def test_bad_values_and_forms_are_errors(cfg, override):
  with pytest.raises(harness.ConfigError, match="model"):
    harness.apply_overrides(cfg, [override])


def test_load_config_variant_and_overrides():
  cfg = harness.load_config(
      "configs/trime_wt103.py:trime_smoke", ["model.remat=False", "seed=3"]
  )
  assert cfg.name == "wt103_trime_smoke"
  assert cfg.loss.name == "trime"
  assert cfg.model.remat is False and cfg.seed == 3
  with pytest.raises(harness.ConfigError, match="no config file"):
    harness.load_config("configs/no_such_file.py:smoke")


def test_disable_lm_warmup(cfg):
  assert harness.disable_lm_warmup(cfg) == {}  # A plain LM: nothing to do.
  cfg.loss.name = "trime"
  cfg.trime.lm_warmup_fraction = 0.05
  changes = harness.disable_lm_warmup(cfg)
  assert changes == {"trime.lm_warmup_fraction": {"config": 0.05, "timed": 0.0}}
  assert cfg.trime.lm_warmup_fraction == 0.0
  assert harness.disable_lm_warmup(cfg) == {}


def test_summarize_takes_the_median_round():
  s = harness.summarize([3.0, 1.0, 2.0], tokens_per_step=100)
  assert s["seconds_per_step_median"] == 2.0
  assert s["seconds_per_step_all_rounds"] == [3.0, 1.0, 2.0]
  assert s["tokens_per_s"] == 50.0
  assert harness.summarize([4.0, 1.0], 10)["seconds_per_step_median"] == 2.5
  assert harness.summarize([], 10) == {}


def test_ratios_against_the_first_result():
  results = [
      {"name": "base", "tokens_per_s": 100.0, "mem": 10, "flops": 0.0},
      {"name": "a", "tokens_per_s": 50.0, "mem": 15, "flops": 1.0},
      {"name": "b", "tokens_per_s": 200.0, "flops": 2.0},
  ]
  rows = harness.ratios(results, ["tokens_per_s", "mem", "flops"])
  assert rows[0] == {"tokens_per_s": 1.0, "mem": 1.0, "flops": None}
  assert rows[1] == {"tokens_per_s": 0.5, "mem": 1.5, "flops": None}
  assert rows[2] == {"tokens_per_s": 2.0, "mem": None, "flops": None}
  assert harness.ratios([], ["x"]) == []
  table = harness.format_table(results, ["tokens_per_s", "mem"])
  assert "baseline, base" in table and "(0.500x)" in table


class FakeBench:
  """Records the order of calls; each run 'takes' a fixed time."""

  def __init__(self, name: str, seconds: float, calls: list[str]):
    self.name, self.seconds, self.calls = name, seconds, calls
    self.times: list[float] = []

  def warm_up(self, steps: int) -> None:
    self.calls.append(f"warm {self.name} {steps}")

  def run(self, steps: int) -> float:
    self.calls.append(f"run {self.name} {steps}")
    return self.seconds


def test_run_rounds_alternates_configs_within_rounds():
  calls, lines = [], []
  benches = [FakeBench("a", 1.0, calls), FakeBench("b", 2.0, calls)]
  harness.run_rounds(
      benches, rounds=2, steps=5, warmup=1, progress=lines.append
  )
  assert calls == [
      "warm a 1",
      "warm b 1",
      "run a 5",
      "run b 5",
      "run a 5",
      "run b 5",
  ]
  assert benches[0].times == [1.0, 1.0] and benches[1].times == [2.0, 2.0]
  assert [l.split(":")[0] for l in lines] == [
      "warm-up of a",
      "warm-up of b",
      "round 1/2",
      "round 2/2",
  ]


def test_run_rounds_without_steps_runs_nothing_and_needs_a_warmup():
  calls = []
  harness.run_rounds([FakeBench("a", 1.0, calls)], rounds=3, steps=0, warmup=0)
  assert not calls
  with pytest.raises(ValueError, match="warmup"):
    harness.run_rounds(
        [FakeBench("a", 1.0, calls)], rounds=1, steps=1, warmup=0
    )


def test_timing_args():
  p = argparse.ArgumentParser()
  harness.add_timing_args(p, steps=10, warmup=1, rounds=3)
  args = p.parse_args(["--set=model.remat=False", "--set=seed=1"])
  assert (args.steps, args.warmup, args.rounds) == (10, 1, 3)
  assert args.set == ["model.remat=False", "seed=1"]
  with pytest.raises(SystemExit):
    p.parse_args(["--warmup=0"])


def test_machine_without_host_name():
  m = harness.machine(devices=False)
  assert m["cpu_count"] and m["jax"] and m["python"]
  assert not {"hostname", "host", "node"} & set(m)
  node = platform.node()
  if len(node) > 4:
    assert node not in json.dumps(m)
