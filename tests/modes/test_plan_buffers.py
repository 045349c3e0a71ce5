"""``--config.plan.buffers``: the largest buffers of a compiled step, read
from XLA's own buffer assignment, on programs whose buffers are known."""

import json
import os
import time

import jax
import jax.numpy as jnp
import pytest

from configs import trime_wt103
from memjax import build
from memjax.modes import plan_buffers
from memjax.modes import platforms
from tests.conftest import run_main

# A buffer assignment as XLA:CPU writes it (two allocations cut short).
ASSIGNMENT = """BufferAssignment:
allocation 0: size 2097152, parameter 1, shape |f32[512,1024]| at ShapeIndex {}:
 value: <14 w.1 @0> (size=2097152,offset=0): f32[512,1024]{1,0}
allocation 1: size 1048592, preallocated-temp:
 value: <15 fusion.2 @0> (size=1048576,offset=0): bf16[512,1024]{1,0}
 value: <16 reduce.3 @0> (size=16,offset=1048576): f32[4]{0}
"""
VALUES = """Used values:
<15 fusion.2 @0>
 positions:
  fusion.2
 from instruction: %fusion.2 = bf16[512,1024]{1,0} fusion(%w.1), kind=kLoop, metadata={op_name="jit(f)/convert_element_type"}
<16 reduce.3 @0>
 positions:
  reduce.3
 from instruction: %reduce.3 = f32[4]{0} reduce(%fusion.2, %c), metadata={op_name="jit(f)/reduce_sum"}
"""


def test_parse_reads_sizes_shapes_kinds_and_ops():
  got = plan_buffers.parse(ASSIGNMENT, VALUES)
  assert [v["bytes"] for v in got] == [2097152, 1048576, 16]
  assert [v["kind"] for v in got] == ["parameter", "temporary", "temporary"]
  assert got[1]["shape"] == "bf16[512,1024]{1,0}" and got[1]["dtype"] == "bf16"
  assert got[1]["op"] == "fusion"
  assert got[1]["op_name"] == "jit(f)/convert_element_type"
  assert got[2]["op"] == "reduce" and got[2]["dtype"] == "f32"
  assert got[0]["op"] == ""  # a parameter: not in the values file here


def test_largest_lists_a_compiled_programs_buffers(tmp_path):
  # tanh(x @ w) is returned, so its [256, 1024] float32 output exists, and
  # the product is a temporary of the same shape; x and w are parameters.
  # A constant of its own (a program no earlier run compiled): the suite's
  # persistent cache would serve a known one, compiling and dumping nothing.
  salt = float(time.time_ns() % 1_000_003)
  f = jax.jit(lambda x, w: (jnp.tanh(x @ w) + salt, (x @ w).sum()))
  dump = str(tmp_path / "dump")
  lowered = f.lower(jnp.ones((256, 512)), jnp.ones((512, 1024)))
  plan_buffers.compile_with_dump(lowered, dump)
  got = plan_buffers.largest(dump, 3)
  assert len(got) == 3
  assert all(v["kind"] != "parameter" for v in got)
  assert [v["bytes"] for v in got] == sorted(
      (v["bytes"] for v in got), reverse=True
  )
  top = got[0]
  assert top["bytes"] == 256 * 1024 * 4
  assert top["shape"].startswith("f32[256,1024]")
  assert any("dot_general" in v["op_name"] for v in got[:2])
  rows = plan_buffers.rows(got, "float32")
  assert rows[0].startswith("Largest buffers of the float32 step")
  assert "| 1.00 | `f32[256,1024]" in rows[4]


def test_main_plans_with_the_largest_buffers(tmp_path):
  workdir = str(tmp_path / "plan")
  r = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--mode=plan",
      "--config.plan.devices=2",
      "--config.plan.buffers=4",
      "--config.plan.fit_batch=False",
      "--config.plan.eval_step=False",
      "--config.plan.dtypes=('float32','bfloat16')",
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert sorted(os.listdir(workdir)) == ["plan.json", "plan.md"]  # no dump
  with open(os.path.join(workdir, "plan.json")) as f:
    plan = json.load(f)
  for dtype in ("float32", "bfloat16"):
    buffers = plan["dtypes"][dtype]["buffers"]
    assert len(buffers) == 4
    temp = plan["dtypes"][dtype]["memory"]["temporaries"]
    assert all(v["kind"] != "parameter" for v in buffers)
    assert max(v["bytes"] for v in buffers if v["kind"] == "temporary") <= temp
    assert f"Largest buffers of the {dtype} step" in r.stdout
  bad = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}2",
      "--mode=plan",
      "--config.plan.buffers=-1",
  )
  assert bad.returncode == 2
  assert "plan.buffers must be an integer >= 0" in bad.stderr


def test_a_step_that_dumped_nothing_is_named(tmp_path):
  # A step served by the persistent compilation cache is not compiled.
  with pytest.raises(FileNotFoundError, match="no buffer assignment"):
    plan_buffers.largest(str(tmp_path), 3)


def test_listing_buffers_turns_the_compilation_cache_off():
  config = trime_wt103.get_config("smoke")
  environ = {}
  platforms.set_device_flags(build.read(config, build.parts()), environ)
  assert "JAX_ENABLE_COMPILATION_CACHE" not in environ
  config.plan.buffers = 2
  platforms.set_device_flags(build.read(config, build.parts()), environ)
  assert environ["JAX_ENABLE_COMPILATION_CACHE"] == "false"
