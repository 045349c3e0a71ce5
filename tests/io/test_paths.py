"""memjax.io.paths: every file memjax writes, on fsspec's in-memory filesystem
(no bucket is reachable here), and workdirs that cannot be opened."""

import json
import os
import subprocess
import sys
import time
import uuid

import fsspec
import numpy as np
import pytest

from memjax import build
from memjax import config as config_lib
from memjax import settings as settings_lib
from memjax import errors
from memjax.io import paths
from memjax.io import workdirs
from tests.conftest import REPO, xla_flags


@pytest.fixture
def mem():
  """A fresh ``memory://`` folder, removed afterwards."""
  root = f"memory://t{uuid.uuid4().hex[:8]}"
  yield root
  fs = fsspec.filesystem("memory")
  if fs.exists(root):
    fs.rm(root, recursive=True)


def test_url_names_are_never_made_local(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.resolve("gs://bucket/run/") == "gs://bucket/run"
  assert paths.join("gs://bucket/run", "checkpoints", "10") == (
      "gs://bucket/run/checkpoints/10"
  )
  assert paths.dirname("gs://bucket/run/config.json") == "gs://bucket/run"
  assert paths.basename("s3://b/run/results.json") == "results.json"
  assert paths.resolve("rel/x") == os.path.join(str(tmp_path), "rel", "x")
  assert paths.resolve("file:///tmp/x") == "/tmp/x"
  assert paths.resolve("~/x") == os.path.expanduser("~/x")
  assert not paths.is_url("/a/b") and not paths.is_url("file:///a")
  assert paths.is_url("memory://a") and paths.is_url("gs://a")
  assert os.listdir(tmp_path) == []


def test_files_lists_and_moves_on_memory(mem):
  paths.write_json(paths.join(mem, "a", "x.json"), {"b": 1, "a": [1, 2]})
  assert paths.read_json(f"{mem}/a/x.json") == {"a": [1, 2], "b": 1}
  paths.append_text(f"{mem}/a/log.jsonl", "1\n")
  paths.append_text(f"{mem}/a/log.jsonl", "2\n")
  assert paths.read_text(f"{mem}/a/log.jsonl") == "1\n2\n"
  assert paths.listdir(f"{mem}/a") == ["log.jsonl", "x.json"]
  assert paths.glob(f"{mem}/a/*.json") == [f"{mem}/a/x.json"]
  assert paths.isdir(f"{mem}/a") and paths.isfile(f"{mem}/a/x.json")
  paths.rename(f"{mem}/a", f"{mem}/b")
  assert not paths.exists(f"{mem}/a") and paths.exists(f"{mem}/b/x.json")
  assert paths.du(f"{mem}/b") == len(paths.read_bytes(f"{mem}/b/x.json")) + 4
  paths.rmtree(f"{mem}/b")
  assert not paths.exists(f"{mem}/b")


def test_arrays_round_trip_on_memory(mem):
  a = np.arange(12, dtype=np.int32).reshape(3, 4)
  paths.np_save(f"{mem}/a.npy", a)
  np.testing.assert_array_equal(paths.np_load(f"{mem}/a.npy"), a)
  # The bytes are NumPy's own .npy format.
  assert paths.read_bytes(f"{mem}/a.npy")[:6] == b"\x93NUMPY"


def test_local_copies_of_url_files_and_dirs(mem, tmp_path):
  paths.write_bytes(f"{mem}/d/x.bin", b"abc")
  local = paths.local_file(f"{mem}/d/x.bin")
  assert not paths.is_url(local)
  with open(local, "rb") as f:
    assert f.read() == b"abc"
  with paths.local_dir(f"{mem}/built", "w") as d:
    os.makedirs(os.path.join(d, "sub"))
    with open(os.path.join(d, "sub", "y.txt"), "w") as f:
      f.write("y")
  assert not os.path.exists(d)  # The temporary folder is gone.
  assert paths.read_text(f"{mem}/built/sub/y.txt") == "y"
  with paths.local_dir(f"{mem}/built", "r") as d:
    with open(os.path.join(d, "sub", "y.txt")) as f:
      assert f.read() == "y"
  # Local paths are used in place.
  with paths.local_dir(str(tmp_path / "here"), "w") as d:
    assert d == str(tmp_path / "here")


def _config():
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top

  return trime_wt103.get_config("smoke")


def test_run_files_config_and_vocabulary_on_memory(mem):
  from memjax.checkpoints import runfiles  # pylint: disable=g-import-not-at-top
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  config = _config()
  words = vocab_lib.WordVocabulary(["<pad>", "<eos>", "<unk>", "the", "cat"])
  runfiles.write_run_files(mem, settings_lib.to_json(config), words)
  assert paths.listdir(mem) == ["config.json", "vocab.json", "vocab.txt"]
  files = runfiles.RunFiles("run", mem)
  saved = config_lib.from_json(runfiles.read_config_text(files))
  assert saved.model.d_model == config.model.d_model
  assert saved.data.corpus == config.data.corpus
  assert files.read_json("vocab.json") == {
      "kind": "words",
      "file": "vocab.txt",
      "size": 5,
  }
  data = build.read(saved, build.parts()).data
  back = runfiles.read_vocabulary(files, data)
  assert list(back.tokens) == ["<pad>", "<eos>", "<unk>", "the", "cat"]


def test_training_log_and_results_on_memory(mem):
  from memjax.run import loop  # pylint: disable=g-import-not-at-top

  log = paths.join(mem, "train_log.jsonl")
  loop._append_log(log, ['{"step": 1}\n'])  # pylint: disable=protected-access
  loop._append_log(log, ['{"step": 2}\n', '{"step": 3}\n'])  # pylint: disable=protected-access
  steps = [json.loads(l)["step"] for l in paths.read_text(log).splitlines()]
  assert steps == [1, 2, 3]
  paths.write_json(paths.join(mem, "results.json"), {"valid": {"ppl": 2.5}})
  assert paths.read_json(f"{mem}/results.json") == {"valid": {"ppl": 2.5}}


def test_export_metadata_on_memory(mem, monkeypatch):
  from memjax.checkpoints import checkpointing  # pylint: disable=g-import-not-at-top
  from memjax.checkpoints import runfiles  # pylint: disable=g-import-not-at-top
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  # Orbax writes the arrays (it opens gs:// itself, not memory://): here a
  # stand-in records where.
  monkeypatch.setattr(
      checkpointing,
      "save_export_params",
      lambda d, p: paths.write_text(paths.join(d, "stand-in"), "params"),
  )
  params = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
  out = f"{mem}/export"
  for _ in range(2):  # The second export replaces the first whole.
    runfiles.write_export(
        out,
        settings_lib.to_json(_config()),
        vocab_lib.byte_vocabulary(),
        params,
        {"step": 7},
    )
  assert paths.listdir(mem) == ["export"]
  assert paths.listdir(out) == [
      "config.json",
      "export.json",
      "params",
      "vocab.json",
  ]
  assert paths.read_json(f"{out}/export.json") == {"step": 7, "num_params": 9}
  assert runfiles.find(out) == runfiles.RunFiles("export", out)
  assert runfiles.not_a_run(out) == "an export"


def test_datastore_manifest_and_shards_on_memory(mem):
  from memjax.memory import datastore as ds  # pylint: disable=g-import-not-at-top
  from memjax.memory import datastore_batches  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  keys = rng.standard_normal((5, 4)).astype(np.float32)
  values = np.array([3, 1, 4, 1, 5])
  sig = {"model": {"d_model": 4}}
  store = ds.from_arrays(f"{mem}/a", keys, values, signature=sig, shard_size=3)
  assert paths.listdir(f"{mem}/a") == [
      "manifest.json",
      "shard-00000.keys",
      "shard-00000.values",
      "shard-00001.keys",
      "shard-00001.values",
  ]
  assert paths.getsize(f"{mem}/a/shard-00000.keys") == 3 * 4 * 2
  np.testing.assert_array_equal(
      np.concatenate(store.keys), keys.astype(np.float16)
  )
  np.testing.assert_array_equal(np.concatenate(store.values), values)
  # The shard writer of a build (features of two batches of two pairs).
  spec = datastore_batches.BatchBuildSpec(
      signature=sig,
      checkpoint={"source": "x", "step": 1},
      dim=4,
      corpus="c",
      split="train",
      context={},
      num_batches=2,
      shard_batches=1,
  )

  def features(batch):
    return batch["g"], batch["v"], np.arange(2)

  batches = lambda a, b: (
      {"g": keys[2 * i : 2 * i + 2], "v": values[2 * i : 2 * i + 2]}
      for i in range(a, b)
  )
  built = datastore_batches.build_from_batches(
      features, batches, spec, f"{mem}/b"
  )
  assert "build.json" in paths.listdir(f"{mem}/b")
  assert not [n for n in paths.listdir(f"{mem}/b") if "tmp" in n]
  np.testing.assert_array_equal(
      np.concatenate(built.keys), keys[:4].astype(np.float16)
  )
  assert paths.read_json(f"{mem}/b/manifest.json")["count"] == 4


def test_plots_on_memory(mem):
  from memjax.modes import position_loss  # pylint: disable=g-import-not-at-top

  results = {
      "documents": 3,
      "valid": {
          "buckets": [{"bucket": 0, "nll": 3.0}, {"bucket": 64, "nll": 2.0}]
      },
  }
  position_loss.plot(results, f"{mem}/position_loss.png")
  assert (
      paths.read_bytes(f"{mem}/position_loss.png")[:8] == b"\x89PNG\r\n\x1a\n"
  )


class _SlowFileSystem(fsspec.AbstractFileSystem):
  """A filesystem that never answers (a bucket without credentials)."""

  protocol = "memjaxslow"

  def exists(self, path, **kwargs):
    time.sleep(30)


def test_unreachable_storage_is_one_line_within_the_timeout():
  fsspec.register_implementation("memjaxslow", _SlowFileSystem, clobber=True)
  start = time.time()
  with pytest.raises(errors.StorageError, match="did not answer within 1 s"):
    workdirs.check_workdir("memjaxslow://bucket/run", timeout_s=1.0)
  assert time.time() - start < 5


def test_unknown_scheme_is_one_line():
  with pytest.raises(errors.StorageError, match="unknown storage scheme"):
    workdirs.check_workdir("nosuchscheme://bucket/run")
  workdirs.check_workdir("memory://anything")  # Opens; nothing is written.
  assert not fsspec.filesystem("memory").exists("memory://anything")


def test_gs_workdir_that_cannot_be_opened_exits_2_in_one_line(tmp_path):
  """With gcsfs and no network or credentials, the probe's timeout
  (workdirs.PROBE_TIMEOUT_S, 6 s) ends the run: about 8 s here in all, with
  the process's start-up. The bound leaves room for a start-up slowed by
  other work on the machine, and still fails a probe that outlives its
  timeout by much."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), PYTHONPATH=REPO)
  start = time.time()
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "memjax.main",
          f"--config={REPO}/configs/trime_wt103.py:smoke",
          "--workdir=gs://memjax-no-such-bucket/run",
      ],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=60,
  )
  elapsed = time.time() - start
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("memjax: error:"), lines
  assert "gs://memjax-no-such-bucket/run" in lines[0]
  assert elapsed < workdirs.PROBE_TIMEOUT_S + 24, elapsed
  assert os.listdir(tmp_path) == []  # No local folder named gs:.
