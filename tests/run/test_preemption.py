"""Stopping on SIGTERM or Ctrl-C: the handler, and a preempted real run."""

import glob
import json
import os
import signal
import subprocess
import sys
import threading
from unittest import mock

import jax
import numpy as np
import pytest

from memjax.run import preemption
from tests import conftest

NUM_STEPS = 20  # configs/trime_wt103.py:smoke, as the shared smoke run.


class _FakeCheckpointer:
  directory = "/ckpt"

  def __init__(self):
    self.waited = False

  def wait(self):
    self.waited = True


# The unit tests send signals with signal.raise_signal, which delivers them
# to this (the main) thread before it returns. os.kill(os.getpid(), ...) may
# land on any of the process's threads (XLA's included), and Python then
# runs the handler only when the main thread next checks: the assertion
# right after it could run first.


def test_sigterm_is_a_request_and_the_handler_is_restored_after():
  before = signal.getsignal(signal.SIGTERM)
  with preemption.StopSignal() as stop:
    assert not stop.should_stop(1)
    signal.raise_signal(signal.SIGTERM)
    assert stop.should_stop(2) and stop.received == signal.SIGTERM
    ckpt = _FakeCheckpointer()
    e = stop.stopped(2, ckpt)
  assert ckpt.waited  # The checkpoint is written before the run ends.
  assert (e.step, e.exit_status) == (2, 128 + 15)
  assert str(e) == "stopped on SIGTERM at step 2"
  assert signal.getsignal(signal.SIGTERM) is before


def test_second_ctrl_c_interrupts_at_once():
  # Python's own SIGINT handler before, whatever an earlier test in this
  # process left (the second Ctrl-C goes to the handler found on entry).
  found = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with preemption.StopSignal() as stop:
      signal.raise_signal(signal.SIGINT)
      assert (
          stop.should_stop(1)
          and stop.stopped(1, _FakeCheckpointer()).exit_status == 130
      )
      with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  finally:
    signal.signal(signal.SIGINT, found)


def test_outside_the_main_thread_nothing_is_caught():
  seen = []

  def enter():
    with preemption.StopSignal() as stop:
      seen.append(signal.getsignal(signal.SIGTERM) is not stop._handle)

  before = signal.getsignal(signal.SIGTERM)
  t = threading.Thread(target=enter)
  t.start()
  t.join()
  assert seen == [True] and signal.getsignal(signal.SIGTERM) is before


def test_several_processes_ask_jax_preemption_service():
  # Unit test of the multi-process branch: two processes simulated.
  sync_points = {3}
  with (
      mock.patch.object(
          preemption.jax.distributed, "is_initialized", return_value=True
      ),
      mock.patch.object(
          preemption.multihost_utils,
          "reached_preemption_sync_point",
          side_effect=lambda step: step in sync_points,
      ),
  ):
    before = signal.getsignal(signal.SIGTERM)
    with preemption.StopSignal() as stop:
      # SIGTERM is left to JAX's runtime.
      assert signal.getsignal(signal.SIGTERM) is before
      assert [stop.should_stop(s) for s in (1, 2, 3)] == [False, False, True]
    assert stop.received == signal.SIGTERM


@pytest.fixture
def preemption_service_off():
  jax.config.update("jax_enable_preemption_service", False)
  yield
  jax.config.update("jax_enable_preemption_service", True)


def test_without_the_service_processes_share_their_signals(
    preemption_service_off,
):
  gathered = iter([np.array([0, 0]), np.array([0, 15])])
  with (
      mock.patch.object(preemption.jax, "process_count", return_value=2),
      mock.patch.object(
          preemption.multihost_utils,
          "process_allgather",
          side_effect=lambda x: next(gathered),
      ),
  ):
    with preemption.StopSignal() as stop:
      # Both signals are caught here too.
      assert signal.getsignal(signal.SIGTERM) == stop._handle
      # This process got nothing; the other one got SIGTERM at step 2.
      assert [stop.should_stop(1), stop.should_stop(2)] == [False, True]
    assert stop.received == signal.SIGTERM


def _losses(workdir):
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  steps = [r["step"] for r in rows]
  assert len(steps) == len(set(steps)), f"steps logged twice: {steps}"
  return {r["step"]: r["loss"] for r in rows}


def test_sigterm_mid_run_saves_and_relaunch_matches_uninterrupted(
    tmp_path, smoke_workdir
):
  workdir = str(tmp_path / "run")
  # The shared smoke run's config, with a progress line every update and
  # the first two updates traced (neither changes the updates).
  args = (
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--config.train.log_every=1",
      "--config.train.profile_steps=(1,2)",
  )
  env = dict(os.environ, XLA_FLAGS=conftest.xla_flags(1))
  proc = subprocess.Popen(
      [sys.executable, "-m", "memjax.main", *args],
      cwd=conftest.REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  out = []
  try:
    for line in proc.stdout:
      out.append(line)
      if f"step 2/{NUM_STEPS}" in line:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  out = "".join(out)
  # The signal lands after any update from the 2nd to the last (the loop
  # checks it after each); the run stops there, before its final evaluation.
  assert proc.returncode == 143, err[-3000:]
  assert "Traceback" not in err and "results:" not in out
  stopped = [l for l in out.splitlines() if "stopped on SIGTERM" in l]
  assert len(stopped) == 1 and "relaunching the same command resumes" in out
  step = int(stopped[0].split("at step ")[1].split(";")[0])
  print(f"SIGTERM after update 2 stopped the run at update {step}")
  assert 2 <= step <= NUM_STEPS
  ckpts = os.listdir(os.path.join(workdir, "checkpoints"))
  assert str(step) in ckpts and all(int(c) <= step for c in ckpts)
  assert sorted(_losses(workdir)) == list(range(1, step + 1))
  # The stopped job released its lease on the workdir.
  assert not os.path.exists(os.path.join(workdir, "lease.json"))
  assert glob.glob(
      os.path.join(workdir, "profile", "**", "*.xplane.pb"), recursive=True
  )

  again = conftest.run_main(*args[:3])
  assert again.returncode == 0, again.stderr[-3000:]
  assert (
      f"resumed from {os.path.join(workdir, 'checkpoints')} at step "
      f"{step}" in again.stdout
  )
  # Losses bit for bit those of the uninterrupted run.
  assert _losses(workdir) == _losses(smoke_workdir)
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  with open(os.path.join(smoke_workdir, "results.json")) as f:
    whole = json.load(f)
  assert results["step"] == NUM_STEPS
  assert results["valid"]["nll"] == whole["valid"]["nll"]
