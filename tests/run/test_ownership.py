"""memjax.run.ownership: one training job per workdir, through memjax.main
(a second job refused, a kill -9 relaunch taking the lease over) and the
agreement of a --multihost job's processes."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

import memjax
from memjax import errors
from memjax.io import lease
from memjax.run import ownership
from tests import conftest
from tests.checkpoints.test_runfiles import _tree


def test_process_0_holds_the_lease_while_the_block_runs(tmp_path):
  path = tmp_path / lease.LEASE_FILE
  with ownership.sole_writer(str(tmp_path)) as held:
    assert json.loads(path.read_text())["job"] == held.me.job
    with pytest.raises(lease.BusyError):
      with ownership.sole_writer(str(tmp_path)):
        pass
  assert not path.exists()


def test_readers_neither_take_nor_wait_for_the_lease(tmp_path, smoke_workdir):
  workdir = str(tmp_path / "run")
  shutil.copytree(smoke_workdir, workdir)
  # A job training there (no heartbeat during the test).
  with lease.Lease(workdir, heartbeat=3600) as held:
    before = (tmp_path / "run" / lease.LEASE_FILE).read_bytes()
    loaded = memjax.load(workdir)
    assert loaded.step == 20
    assert (tmp_path / "run" / lease.LEASE_FILE).read_bytes() == before
    assert json.loads(before)["job"] == held.me.job


def _as_process(monkeypatch, index: int, told: list[int], answer: int):
  """This process as process ``index`` of two; the broadcast from process 0
  records what it is told and answers ``answer``."""
  monkeypatch.setattr(jax, "process_index", lambda: index)
  monkeypatch.setattr(jax, "process_count", lambda: 2)

  def broadcast(x):
    told.append(int(x))
    return np.int32(answer)

  monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", broadcast)


def test_the_other_processes_share_the_workdir_and_follow_process_0(
    tmp_path, monkeypatch
):
  told = []
  _as_process(monkeypatch, 1, told, answer=1)
  with ownership.sole_writer(str(tmp_path)) as held:
    assert held is None and not os.listdir(tmp_path)  # No lease of its own.
  _as_process(monkeypatch, 1, told, answer=0)  # Process 0 was refused.
  with pytest.raises(errors.WorkdirError, match="process 0 of this job"):
    with ownership.sole_writer(str(tmp_path)):
      pass
  # Process 0, refused, tells the others before it raises.
  with lease.Lease(str(tmp_path)):
    _as_process(monkeypatch, 0, told, answer=0)
    with pytest.raises(lease.BusyError):
      with ownership.sole_writer(str(tmp_path)):
        pass
  assert told == [1, 1, 0]


def _steps(workdir: str) -> dict[int, list[float]]:
  """{step: the losses logged for it}."""
  out = {}
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    for row in map(json.loads, f):
      out.setdefault(row["step"], []).append(row["loss"])
  return out


def test_a_second_job_is_refused_and_a_kill_9_relaunch_takes_over(
    tmp_path, smoke_workdir
):
  workdir = str(tmp_path / "run")
  # The shared smoke run's updates, with a progress line every update and
  # a shorter evaluation (which changes no update).
  args = (
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--config.train.log_every=1",
      "--config.train.eval_every=0",
      "--config.eval.max_windows=2",
  )
  env = dict(os.environ, XLA_FLAGS=conftest.xla_flags(1))
  with open(tmp_path / "first.err", "w") as err:
    first = subprocess.Popen(
        [sys.executable, "-m", "memjax.main", *args],
        cwd=conftest.REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
  try:
    ckpt_10 = os.path.join(workdir, "checkpoints", "10")
    for line in first.stdout:
      # Held mid-run, its lease fresh, once checkpoint 10 is written.
      done = re.search(r"step (\d+)/20", line)
      if done and (os.path.isdir(ckpt_10) or int(done[1]) >= 18):
        first.send_signal(signal.SIGSTOP)
        break
    before = _tree(workdir)
    second = conftest.run_main(*args)
    assert _tree(workdir) == before  # The first job's files are intact.
    first.kill()  # kill -9.
    first.wait()
  finally:
    if first.poll() is None:
      first.kill()
      first.wait()
  assert second.returncode == 2, second.stderr[-3000:]
  lines = second.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("memjax: error:"), lines
  assert f"pid {first.pid}" in lines[0] and " s ago" in lines[0]
  assert "being trained by another job" in lines[0]
  assert os.path.isfile(os.path.join(workdir, lease.LEASE_FILE))

  resumes = os.path.isdir(ckpt_10)
  again = conftest.run_main(*args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "took over the lease" in again.stdout
  if resumes:
    assert "at step 10" in again.stdout, again.stdout
  print("checkpoint 10 written before kill -9:", resumes)
  # Every loss bit for bit that of the uninterrupted run, and logged once:
  # the lines the killed job wrote after checkpoint 10 were dropped.
  whole = {s: v[0] for s, v in _steps(smoke_workdir).items()}
  got = _steps(workdir)
  assert sorted(got) == sorted(whole) == list(range(1, 21))
  assert got == {s: [v] for s, v in whole.items()}
  assert not os.path.exists(os.path.join(workdir, lease.LEASE_FILE))


def test_a_job_whose_lease_was_taken_stops_before_writing_again(
    tmp_path, monkeypatch
):
  """A job that paused past the staleness period finds another job holding
  its workdir: it stops in one line at its next log or checkpoint, and
  that job's lease is left in place."""
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax.run import loop  # pylint: disable=g-import-not-at-top

  monkeypatch.setenv(lease.HEARTBEAT_ENV, "0.05")
  config = trime_wt103.get_config("smoke")
  config.train.num_steps = 6
  config.train.log_every = 1
  config.train.checkpoint_every = 2
  config.train.eval_every = 0
  workdir = str(tmp_path / "run")
  intruder = dataclasses.replace(lease.Holder.of_this_process(), job="other")

  def taken_after_step_2(step, state):
    del state
    if step == 2:  # The other job takes the lease over while this sleeps.
      held = ownership._HELD[workdir]  # pylint: disable=protected-access
      # As a take-over writes it: under the directory's lock, which the
      # heartbeat's read and rewrite hold too.
      with lease._serialised(workdir):  # pylint: disable=protected-access
        with open(held.path, "wb") as f:
          f.write(intruder.to_bytes())
      deadline = time.monotonic() + 10
      while not held.lost and time.monotonic() < deadline:
        time.sleep(0.02)

  with pytest.raises(ownership.LeaseLostError) as e:
    with ownership.sole_writer(workdir):
      loop.train_and_evaluate(
          build.build(config, workdir), hooks=(taken_after_step_2,)
      )
  assert "\n" not in str(e.value)
  assert "before writing step 3" in str(e.value) and "job" in str(e.value)
  assert sorted(_steps(workdir)) == [1, 2]
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["2"]
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  with open(os.path.join(workdir, lease.LEASE_FILE)) as f:
    assert json.load(f)["job"] == "other"
