"""memjax.checkpointing: a workdir URL reaches Orbax as it was given."""

import os

from memjax import checkpointing


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
