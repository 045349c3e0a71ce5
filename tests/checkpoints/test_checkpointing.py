"""The latest step is restored; of damaged checkpoints the previous step is
restored, a second damaged copy of a step gets a name of its own, only the
first process moves a step, and a workdir whose every checkpoint is damaged
stops the run unless asked to start again. A workdir URL reaches Orbax as it was given.
"""

import os
import shutil

import jax
import numpy as np
import pytest

from memjax.checkpoints import checkpointing
from memjax import errors
from tests import conftest


def _state(step):
  return {"w": np.full((3,), float(step), np.float32)}


def _abstract():
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0)
  )


def _checkpointer(directory):
  return checkpointing.Checkpointer(str(directory), keep=5, signature={})


def _save(ckpt, *steps):
  for step in steps:
    ckpt.save(step, _state(step), {"step": step}, force=True)
  ckpt.wait()


def _damage(directory, step):
  """Overwrites the array files of ``step`` (as a crash mid-write might)."""
  hit = 0
  for root, _, files in os.walk(os.path.join(directory, str(step), "state")):
    for name in files:
      if name != "commit_success.txt":
        with open(os.path.join(root, name), "wb") as f:
          f.write(b"\0garbage")
        hit += 1
  assert hit


def _listing(directory):
  return sorted(os.listdir(directory))


def test_the_latest_readable_step_is_restored(tmp_path):
  ckpt = _checkpointer(tmp_path)
  try:
    _save(ckpt, 1, 2)
    state, position, step = ckpt.restore_latest(_abstract())
    assert step == 2 and position == {"step": 2}
    np.testing.assert_array_equal(state["w"], [2, 2, 2])
    assert _listing(tmp_path) == ["1", "2"]  # nothing set aside
    _damage(tmp_path, 2)
    state, position, step = ckpt.restore_latest(_abstract())
    assert step == 1 and position == {"step": 1}
    np.testing.assert_array_equal(state["w"], [1, 1, 1])
  finally:
    ckpt.close()
  assert _listing(tmp_path) == ["1", "damaged-2"]


def test_second_damaged_copy_of_a_step_gets_a_new_name(tmp_path):
  ckpt = _checkpointer(tmp_path)
  try:
    _save(ckpt, 1, 2)
    _damage(tmp_path, 2)
    state, position, step = ckpt.restore_latest(_abstract())
    assert step == 1 and position == {"step": 1}
    np.testing.assert_array_equal(state["w"], [1, 1, 1])
    _save(ckpt, 2)
    _damage(tmp_path, 2)
    assert ckpt.restore_latest(_abstract())[2] == 1
  finally:
    ckpt.close()
  assert _listing(tmp_path) == ["1", "damaged-2", "damaged-2.1"]


def test_every_checkpoint_damaged_stops_unless_asked(tmp_path):
  ckpt = _checkpointer(tmp_path)
  try:
    _save(ckpt, 1, 2)
    _damage(tmp_path, 1)
    _damage(tmp_path, 2)
    with pytest.raises(errors.ResumeError) as e:
      ckpt.restore_latest(_abstract())
    assert "\n" not in str(e.value)
    assert "damaged-1, damaged-2" in str(e.value)
    assert "restart_if_damaged" in str(e.value)
    # Run again: no step is left, but the run still does not start afresh.
    with pytest.raises(errors.ResumeError):
      ckpt.restore_latest(_abstract())
    assert ckpt.restore_latest(_abstract(), restart_if_damaged=True) is None
  finally:
    ckpt.close()
  assert _listing(tmp_path) == ["damaged-1", "damaged-2"]  # kept


def test_a_new_workdir_has_nothing_to_restore(tmp_path):
  ckpt = _checkpointer(tmp_path)
  try:
    assert ckpt.restore_latest(_abstract()) is None
  finally:
    ckpt.close()


@pytest.mark.parametrize("process, moved", [(0, True), (1, False)])
def test_only_the_first_process_moves_a_damaged_step(
    tmp_path, monkeypatch, process, moved
):
  ckpt = _checkpointer(tmp_path)
  try:
    _save(ckpt, 1, 2)
    monkeypatch.setattr(jax, "process_index", lambda: process)
    dest = ckpt._set_aside(2)  # pylint: disable=protected-access
  finally:
    monkeypatch.undo()
    ckpt.close()
  # Every process names the same destination; only process 0 renames.
  assert dest == os.path.join(str(tmp_path), "damaged-2")
  assert os.path.isdir(dest) == moved
  assert os.path.isdir(tmp_path / "2") != moved


def test_run_whose_every_checkpoint_is_damaged_stops_with_one_line(
    tmp_path, smoke_workdir
):
  workdir = str(tmp_path / "run")
  shutil.copytree(smoke_workdir, workdir)
  ckpt = os.path.join(workdir, "checkpoints")
  steps = [n for n in os.listdir(ckpt) if n.isdigit()]
  for step in steps:
    _damage(ckpt, step)
  before = _listing(workdir)
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    log = f.read()
  proc = conftest.run_main(
      "--config=configs/trime_wt103.py:smoke", f"--workdir={workdir}"
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = proc.stderr.strip().splitlines()[-1]
  assert "every checkpoint" in line and "restart_if_damaged" in line, line
  assert "Traceback" not in proc.stderr
  assert _listing(ckpt) == sorted(f"damaged-{s}" for s in steps)
  assert _listing(workdir) == before
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    assert f.read() == log


class _Recorder:
  """Stands in for orbax.checkpoint.CheckpointManager; records its
  directory and creates nothing."""

  directories: list = []

  def __init__(self, directory, *args, **kwargs):
    del args, kwargs
    _Recorder.directories.append(directory)


def test_a_url_reaches_orbax_unchanged_and_nothing_is_local(
    tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(checkpointing.ocp, "CheckpointManager", _Recorder)
  _Recorder.directories.clear()
  url = "gs://bucket/run/checkpoints"
  ckpt = checkpointing.Checkpointer(url, keep=2, signature={"model": {}})
  assert _Recorder.directories == [url] and ckpt.directory == url
  assert os.listdir(tmp_path) == []  # No folder named gs: here.
  # A local path is still made absolute.
  checkpointing.Checkpointer("run/checkpoints", keep=2, signature={})
  assert _Recorder.directories[-1] == str(tmp_path / "run" / "checkpoints")
