"""memjax.io.lease: one job per directory, its heartbeat, and the holders
that are taken over (stale, dead, damaged), on local paths and URLs."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import fsspec
import psutil
import pytest

from memjax import errors
from memjax.io import lease
from memjax.io import paths


def _record(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def _plant(path: str, **changes) -> lease.Holder:
  """Writes a holder's record (another job's, on this host, running: this
  process) with ``changes``; returns it."""
  holder = dataclasses.replace(lease.Holder.of_this_process(), **changes)
  paths.makedirs(paths.dirname(path))
  paths.write_bytes(path, holder.to_bytes())
  return holder


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def test_a_second_job_is_refused_with_the_holder_and_its_heartbeat(tmp_path):
  workdir = str(tmp_path / "run")
  with lease.Lease(workdir) as first:
    before = _record(first.path)
    with pytest.raises(lease.BusyError) as e:
      lease.Lease(workdir).acquire()
    assert _record(first.path) == before  # The holder's record is kept.
  text = str(e.value)
  assert isinstance(e.value, errors.UserError) and "\n" not in text
  assert f"host {socket.gethostname()}, pid {os.getpid()}" in text
  assert "heartbeat 0 s ago" in text and "another --workdir" in text
  assert before["job"] == first.me.job and before["processes"] == 1


def test_the_heartbeat_rewrites_the_record_and_release_removes_it(tmp_path):
  workdir = str(tmp_path / "new")
  held = lease.Lease(workdir, heartbeat=0.05)
  held.acquire()
  assert lease.created(workdir)  # The lease made the directory.
  first = _record(held.path)["heartbeat"]
  time.sleep(0.3)
  assert _record(held.path)["heartbeat"] > first
  held.release()
  # The record is gone, and the directory the lease made, left empty, too.
  assert not os.path.exists(workdir) and not lease.created(workdir)
  kept = tmp_path / "kept"
  kept.mkdir()
  with lease.Lease(str(kept)):
    (kept / "config.json").write_text("{}")
  assert os.listdir(kept) == ["config.json"]


@pytest.mark.parametrize(
    "changes",
    [
        {"pid": None},  # The holder process has ended (kill -9).
        {"pid_started": 12.0},  # Its pid now belongs to another process.
        {"boot": 12.0},  # The host restarted since.
    ],
    ids=["ended", "pid_reused", "rebooted"],
)
def test_a_holder_no_longer_running_here_is_taken_over_at_once(
    tmp_path, changes
):
  path = str(tmp_path / lease.LEASE_FILE)
  if changes.get("pid", 0) is None:
    changes = {"pid": _dead_pid()}
  _plant(path, job="old", **changes)  # Its heartbeat is fresh.
  with lease.Lease(str(tmp_path), heartbeat=30) as held:
    assert _record(path)["job"] == held.me.job
  assert not os.path.exists(path)


def test_a_stale_or_damaged_record_is_taken_over(tmp_path, capsys):
  path = str(tmp_path / lease.LEASE_FILE)
  _plant(path, host="elsewhere", heartbeat=time.time() - 121)
  with lease.Lease(str(tmp_path)) as held:  # Stale after 4 x 30 s.
    assert _record(path)["job"] == held.me.job
  assert "from a job that is gone (host elsewhere" in capsys.readouterr().out
  for damaged in ('{"host": "half a rec', "not json at all", "[1, 2]"):
    with open(path, "w") as f:
      f.write(damaged)
    with lease.Lease(str(tmp_path)) as held:
      assert _record(path)["job"] == held.me.job
    out = capsys.readouterr().out
    # Named as unreadable, not as a job of 1970 that is gone.
    assert "from an unreadable record" in out, out
    assert "1970" not in out and "pid 0" not in out


def test_another_host_is_refused_once_its_heartbeat_moves(tmp_path):
  path = str(tmp_path / lease.LEASE_FILE)
  other = _plant(path, host="elsewhere", job="other")

  def beat():
    time.sleep(0.3)
    paths.write_bytes(
        path, dataclasses.replace(other, heartbeat=time.time()).to_bytes()
    )

  t = threading.Thread(target=beat)
  t.start()
  start = time.monotonic()
  with pytest.raises(lease.BusyError, match="host elsewhere"):
    lease.Lease(str(tmp_path), heartbeat=0.2, stale=30).acquire()
  t.join()
  assert time.monotonic() - start < 5
  assert _record(path)["job"] == "other"


def test_another_host_that_stops_beating_is_taken_over_when_stale(tmp_path):
  path = str(tmp_path / lease.LEASE_FILE)
  _plant(path, host="elsewhere", job="other")
  start = time.monotonic()
  with lease.Lease(str(tmp_path), heartbeat=0.2, stale=0.6) as held:
    assert 0.5 < time.monotonic() - start < 5
    assert _record(path)["job"] == held.me.job


def test_a_holder_whose_record_was_replaced_stops_and_says_so(tmp_path, capsys):
  held = lease.Lease(str(tmp_path), heartbeat=0.05)
  held.acquire()
  _plant(held.path, job="intruder")
  deadline = time.monotonic() + 5
  while not held.lost and time.monotonic() < deadline:
    time.sleep(0.05)
  assert held.lost
  assert "was taken from this job" in capsys.readouterr().err
  held.release()
  assert _record(held.path)["job"] == "intruder"  # Not ours to remove.


@pytest.fixture
def mem():
  root = f"memory://lease{uuid.uuid4().hex[:8]}"
  yield root
  fs = fsspec.filesystem("memory")
  if fs.exists(root):
    fs.rm(root, recursive=True)


@pytest.mark.parametrize("exclusive", [True, False], ids=["xb", "no_xb"])
def test_urls_are_leased_alike(mem, monkeypatch, exclusive):
  if not exclusive:  # A store without exclusive create: write, read back.
    real = paths.open

    def no_xb(path, mode="r", **kwargs):
      if "x" in mode:
        raise ValueError(f"mode {mode} not supported")
      return real(path, mode, **kwargs)

    monkeypatch.setattr(paths, "open", no_xb)
  workdir = paths.join(mem, "run")
  with lease.Lease(workdir, heartbeat=0.05) as held:
    assert paths.read_json(held.path)["job"] == held.me.job
    with pytest.raises(lease.BusyError, match=f"pid {os.getpid()}"):
      lease.Lease(workdir).acquire()
    time.sleep(0.2)
    assert paths.read_json(held.path)["heartbeat"] > held.me.started
  assert not paths.exists(held.path)
  _plant(held.path, host="elsewhere", job="old", heartbeat=1.0)
  with lease.Lease(workdir) as again:  # Stale: taken over.
    assert paths.read_json(again.path)["job"] == again.me.job


def test_heartbeat_and_staleness_come_from_the_environment(monkeypatch):
  monkeypatch.setenv(lease.HEARTBEAT_ENV, "2.5")
  assert (lease.heartbeat_s(), lease.stale_s()) == (2.5, 10.0)
  monkeypatch.setenv(lease.STALE_ENV, "7")
  assert lease.stale_s() == 7.0
  monkeypatch.setenv(lease.HEARTBEAT_ENV, "soon")
  with pytest.raises(errors.ConfigError, match="MEMJAX_LEASE_HEARTBEAT_S"):
    lease.heartbeat_s()


def test_the_record_names_this_process():
  me = lease.Holder.of_this_process(processes=2)
  assert (me.host, me.pid, me.processes) == (
      socket.gethostname(),
      os.getpid(),
      2,
  )
  assert me.pid_started == psutil.Process().create_time()
  assert me.running_here() is True
  assert lease.Holder.from_bytes(me.to_bytes()) == me
  assert lease.Holder.from_bytes(b"not json") is None
  assert dataclasses.replace(me, host="elsewhere").running_here() is None
