"""A real two-process run: ``--multihost`` with two CPU processes.

Two ``memjax.main`` processes on this machine (one CPU device each,
``jax.distributed`` with the coordinator on 127.0.0.1, Gloo collectives) train
the smoke config and must give the same per-step losses, final evaluation and
checkpoint as one process with two devices (same ``data=2`` mesh). Then the
two-process run is resumed from its first checkpoint.

The interruption is made deterministic without a hook: the directory is put
in the state a run killed between its checkpoints 3 and 6 leaves on disk
(checkpoint 6 removed, the log cut after step 3), so the rerun must restore
checkpoint 3 in both processes and train steps 4 to 6 again. Killing the
processes once checkpoint 3 appears would race with the last steps, which
take about a second.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import trime_wt103
from memjax import build
from memjax.checkpoints import checkpointing
from memjax.data import corpus as corpus_lib
from tests import conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_STEPS, CHECKPOINT_EVERY = 6, 3
# Small and fast: a loss every step, no periodic evaluation, a short final one.
OVERRIDES = (
    "--config=configs/trime_wt103.py:smoke",
    f"--config.train.num_steps={NUM_STEPS}",
    f"--config.train.checkpoint_every={CHECKPOINT_EVERY}",
    "--config.train.log_every=1",
    "--config.train.eval_every=0",
    "--config.eval.max_windows=4",
)
TIMEOUT_S = 300  # Per run (one or two processes); a run takes 30-90 s.


def _env(devices: int) -> dict[str, str]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = conftest.xla_flags(devices)
  env["JAX_PLATFORMS"] = "cpu"
  # Cross-process collectives on CPU (jax's default, stated for clarity).
  env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
  return env


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(
    started: list[tuple[subprocess.Popen, str]],
    workdir: str,
    extra: Sequence[str],
    devices: int,
    processes: int,
) -> None:
  """Starts memjax.main as ``processes`` processes, appending to ``started``.

  Args:
    started: (process, log file) of every process started so far; each new
      one is appended as soon as it runs, so that ``_finish`` can end it.
    workdir: the run's --workdir.
    extra: more flags.
    devices: CPU devices per process.
    processes: 1, or several joined by jax.distributed (coordinator on
      127.0.0.1).
  """
  base = [sys.executable, "-m", "memjax.main", *OVERRIDES, *extra]
  base.append(f"--workdir={workdir}")
  if processes > 1:
    base += [
        "--multihost",
        f"--coordinator_address=127.0.0.1:{_free_port()}",
        f"--num_processes={processes}",
    ]
  for i in range(processes):
    log = f"{workdir}.process{i}.log"
    with open(log, "w") as f:
      proc = subprocess.Popen(
          base + ([f"--process_id={i}"] if processes > 1 else []),
          cwd=REPO,
          env=_env(devices),
          stdout=f,
          stderr=subprocess.STDOUT,
      )
    started.append((proc, log))


def _finish(
    started: Sequence[tuple[subprocess.Popen, str]],
) -> list[tuple[int, str]]:
  """Waits for started processes; returns (exit status, output) of each.

  When one fails, or TIMEOUT_S passes, the others are killed (a process
  whose peer died would otherwise wait for it in a collective).
  """
  deadline = time.monotonic() + TIMEOUT_S
  try:
    while True:
      codes = [p.poll() for p, _ in started]
      if None not in codes or time.monotonic() > deadline:
        break
      if any(c not in (None, 0) for c in codes):
        break
      time.sleep(0.2)
  finally:
    for proc, _ in started:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  results = []
  for proc, log in started:
    with open(log) as f:
      results.append((proc.returncode, f.read()))
  return results


def _assert_ok(results: list[tuple[int, str]]) -> None:
  for i, (rc, out) in enumerate(results):
    assert rc == 0, f"process {i} exited {rc}:\n{out[-4000:]}"


def _log(workdir: str) -> list[dict[str, Any]]:
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    return [json.loads(line) for line in f]


def _losses(workdir: str) -> dict[int, float]:
  rows = _log(workdir)
  steps = [r["step"] for r in rows]
  assert len(steps) == len(set(steps)), f"steps logged twice: {steps}"
  return {r["step"]: r["loss"] for r in rows}


def _state(workdir: str, step: int) -> Any:
  """The train state of a checkpoint, read back as numpy arrays."""
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  ckptr = ocp.PyTreeCheckpointer()
  tree = ckptr.metadata(path).item_metadata
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  return ckptr.restore(path, restore_args=args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The one-process two-device run and the two-process run, both trained."""
  root = tmp_path_factory.mktemp("multihost")
  # One tokenised copy of the corpus for all runs, made before they start.
  cache = [f"--config.data.cache_dir={root / 'cache'}"]
  config = trime_wt103.get_config("smoke")
  config.data.cache_dir = str(root / "cache")
  s = build.build(config, str(root / "cache")).settings
  corpus_lib.load_corpus(s.data, s.eval, str(root / "cache"))
  one, two = str(root / "one"), str(root / "two")
  # Concurrently: the two-process run spends much of its time waiting.
  started = []
  try:
    _start(started, one, cache, devices=2, processes=1)
    _start(started, two, cache, devices=1, processes=2)
  finally:
    results = _finish(started)
  _assert_ok(results)
  return one, two, cache, results[1:]  # The two processes' outputs.


def test_two_processes_train_like_one_process_with_two_devices(runs):
  one, two, _, results = runs
  (_, out0), (_, out1) = results
  assert "over 2 cpu devices" in out0 and "step 6/6" in out0
  # Process 0 reports and writes the log and results; process 1 stays quiet.
  assert "step 6/6" not in out1 and "results:" not in out1
  # The job's lease (process 0's) was released when it finished.
  assert not os.path.exists(os.path.join(two, "lease.json"))
  a, b = _losses(one), _losses(two)
  assert sorted(a) == sorted(b) == list(range(1, NUM_STEPS + 1))
  steps = sorted(a)
  print("losses one process, two devices:", [a[s] for s in steps])
  print("losses two processes:           ", [b[s] for s in steps])
  np.testing.assert_allclose(
      [b[s] for s in steps], [a[s] for s in steps], rtol=1e-6
  )
  with open(os.path.join(one, "results.json")) as f:
    res_one = json.load(f)
  with open(os.path.join(two, "results.json")) as f:
    res_two = json.load(f)
  assert res_two["step"] == NUM_STEPS
  for split in ("valid", "test"):
    assert res_two[split]["nll"] == pytest.approx(
        res_one[split]["nll"], rel=1e-6
    )


def _assert_same_state(workdir: str, reference: str, step: int) -> None:
  got, want = _state(workdir, step), _state(reference, step)
  assert int(got["step"]) == step
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def _checkpointer(workdir: str) -> checkpointing.Checkpointer:
  return checkpointing.Checkpointer(
      os.path.join(workdir, "checkpoints"),
      keep=2,
      signature={},
      create=False,
  )


def test_two_process_checkpoints_are_complete_and_readable(runs):
  one, two, _, _ = runs
  ckpt_one, ckpt_two = _checkpointer(one), _checkpointer(two)
  try:
    assert ckpt_two.all_steps() == [3, 6]
    for step in (3, 6):
      assert ckpt_two.read_meta(step) == ckpt_one.read_meta(step)
      _assert_same_state(two, one, step)
  finally:
    ckpt_one.close()
    ckpt_two.close()


def test_two_process_run_resumes_from_its_first_checkpoint(runs):
  one, two, cache, _ = runs
  resumed = two + "_resumed"
  shutil.copytree(two, resumed, ignore=shutil.ignore_patterns("cache"))
  # What a run killed after checkpoint 3 and before checkpoint 6 leaves.
  shutil.rmtree(os.path.join(resumed, "checkpoints", "6"))
  os.remove(os.path.join(resumed, "results.json"))
  with open(os.path.join(resumed, "train_log.jsonl"), "w") as f:
    for row in _log(two):
      if row["step"] <= CHECKPOINT_EVERY:
        f.write(json.dumps(row) + "\n")
  started = []
  try:
    _start(started, resumed, cache, devices=1, processes=2)
  finally:
    results = _finish(started)
  _assert_ok(results)
  out0 = results[0][1]
  assert "at step 3" in out0 and "training from step 3 to 6" in out0
  # Steps 1-3 as logged before the interruption, 4-6 by the resumed run.
  a, b = _losses(one), _losses(resumed)
  assert sorted(b) == list(range(1, NUM_STEPS + 1))
  steps = sorted(a)
  print("losses resumed two-process run:", [b[s] for s in steps])
  np.testing.assert_allclose(
      [b[s] for s in steps], [a[s] for s in steps], rtol=1e-6
  )
  assert sorted(os.listdir(os.path.join(resumed, "checkpoints")), key=int) == [
      "3",
      "6",
  ]
  _assert_same_state(resumed, one, NUM_STEPS)
