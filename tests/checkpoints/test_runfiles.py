"""memjax.checkpoints.runfiles: what a workdir holds, and workdirs that are no run."""

import hashlib
import os

import numpy as np
import pytest

import memjax
from memjax import build
from memjax import errors
from memjax.checkpoints import runfiles
from memjax.memory import datastore as ds
from tests.conftest import run_main


def _tree(path) -> dict[str, str]:
  """{relative path: SHA-1} of every file under ``path``."""
  out = {}
  for d, _, files in os.walk(path):
    for f in files:
      with open(os.path.join(d, f), "rb") as fh:
        out[os.path.relpath(os.path.join(d, f), path)] = hashlib.sha1(
            fh.read()
        ).hexdigest()
  return out


def _datastore(path: str) -> str:
  keys = np.arange(12, dtype=np.float32).reshape(3, 4)
  ds.from_arrays(path, keys, np.array([5, 6, 7]), signature={"model": {}})
  return path


def test_what_a_directory_holds(tmp_path):
  assert runfiles.not_a_run(str(tmp_path / "absent")) is None
  assert runfiles.not_a_run(str(tmp_path)) is None  # Empty.
  (tmp_path / "f").write_text("x")
  assert runfiles.not_a_run(str(tmp_path / "f")) == "a file"
  assert runfiles.not_a_run(_datastore(str(tmp_path / "ds"))) == "a datastore"
  cache = tmp_path / "cache"
  cache.mkdir()
  (cache / "wikitext103.train.v12907.b04e8c0404ae.npz").write_bytes(b"")
  (cache / "wikitext103.vocab.9514273f35.txt").write_text("<pad>\n")
  assert runfiles.not_a_run(str(cache)) == "a token cache"
  run = tmp_path / "run"
  (run / "checkpoints" / "10").mkdir(parents=True)
  (run / "config.json").write_text("{}")
  assert runfiles.not_a_run(str(run)) is None
  assert runfiles.not_a_run(str(run / "checkpoints")) == "a checkpoints folder"
  # A run may keep its token cache inside: still a run.
  (run / "x.train.v12.0123456789ab.npz").write_bytes(b"")
  assert runfiles.not_a_run(str(run)) is None


def test_training_refuses_what_other_modes_read(tmp_path):
  # What a mode declares it leaves before training (extend.Mode.writes).
  before = build.parts().files_before_training()

  def check(workdir, training):
    runfiles.check_workdir(workdir, training, before)

  other = tmp_path / "notes"
  other.mkdir()
  (other / "todo.txt").write_text("x")
  with pytest.raises(errors.WorkdirError, match="files but no run"):
    check(str(other), training=True)
  check(str(other), training=False)  # Results go beside.
  # --mode=plan's files, --mode=pack's summary, the lease of a job killed
  # before it wrote anything; training then takes the dir.
  for name in ("plan.json", "bm25_pack.json", "lease.json"):
    prepared = tmp_path / name.replace(".", "_")
    prepared.mkdir()
    (prepared / name).write_text("{}")
    check(str(prepared), training=True)
  export = tmp_path / "export"
  export.mkdir()
  (export / runfiles.EXPORT_FILE).write_text("{}")
  with pytest.raises(errors.WorkdirError, match="holds an export"):
    check(str(export), training=True)
  check(str(export), training=False)  # e.g. --mode=eval.
  store = _datastore(str(tmp_path / "ds"))
  for training in (True, False):
    with pytest.raises(errors.WorkdirError, match="holds a datastore"):
      check(store, training=training)


def _refused(workdir: str, needle: str) -> None:
  before = _tree(workdir)
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke", f"--workdir={workdir}"
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("memjax: error:"), lines
  assert needle in lines[0] and workdir in lines[0]
  assert _tree(workdir) == before  # Nothing added, changed or removed.


def test_training_into_an_export_is_refused(smoke_workdir, tmp_path):
  out = memjax.export(smoke_workdir, str(tmp_path / "export"))
  _refused(out, "holds an export")


def test_training_into_a_datastore_is_refused(tmp_path):
  _refused(_datastore(str(tmp_path / "ds")), "holds a datastore")


def test_init_from_must_name_a_run_or_export_unless_the_run_resumes(tmp_path):
  workdir, source = tmp_path / "run", tmp_path / "source"
  with pytest.raises(errors.MissingRunError, match=r"^train.init_from=.*"):
    runfiles.check_init_from(str(source), str(workdir))
  (source / "checkpoints" / "4").mkdir(parents=True)
  runfiles.check_init_from(str(source), str(workdir))  # A run.
  export = tmp_path / "export"
  export.mkdir()
  (export / runfiles.EXPORT_FILE).write_text("{}")
  runfiles.check_init_from(str(export), str(workdir))
  # A run that resumes from its own checkpoint no longer reads the source.
  (workdir / "checkpoints" / "2").mkdir(parents=True)
  runfiles.check_init_from(str(tmp_path / "gone"), str(workdir))
  runfiles.check_init_from("", str(tmp_path / "new"))
