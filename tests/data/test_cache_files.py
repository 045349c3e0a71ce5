"""A damaged token cache: set aside and rebuilt, or one line without its
corpus."""

import os
import shutil
import zipfile

import numpy as np
import pytest

from memjax import errors
from memjax.data import cache_files
from memjax.data import tasks
from tests.conftest import REPO
from tests.conftest import run_main

CONFIG = "--config=configs/trime_wt103.py:smoke"


def _cut(path):
  """Cuts a file to half its length, as an interrupted copy leaves it."""
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])


def _corpus_file(path):
  def fn():
    if not os.path.isfile(path):
      raise errors.DataError(f"missing {path}")
    return path

  return fn


def test_a_good_file_is_read_a_cut_one_set_aside(tmp_path):
  path = str(tmp_path / "c.npz")
  np.savez(path, tokens=np.arange(5, dtype=np.int32))
  corpus = tmp_path / "train.txt"
  corpus.write_text("text")
  read = lambda p: np.load(p)["tokens"]  # noqa: E731
  got = cache_files.read(path, read, _corpus_file(str(corpus)))
  np.testing.assert_array_equal(got, np.arange(5))
  (tmp_path / "other.npz").write_bytes(b"kept")
  _cut(path)
  with pytest.raises(zipfile.BadZipFile):
    read(path)
  assert cache_files.read(path, read, _corpus_file(str(corpus))) is None
  assert sorted(os.listdir(tmp_path)) == [
      "c.npz.damaged",
      "other.npz",
      "train.txt",
  ]


def test_without_its_corpus_a_damaged_file_is_one_error(tmp_path):
  path = str(tmp_path / "c.npy")
  np.save(path, np.arange(1000, dtype=np.int32))
  _cut(path)
  with pytest.raises(errors.DataError, match="c.npy is damaged") as e:
    cache_files.read(path, np.load, _corpus_file(str(tmp_path / "gone")))
  assert "\n" not in str(e.value)
  assert os.listdir(tmp_path) == ["c.npy"]  # Left as it is.


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
  """(a copy of the demo WikiText, its caches made by --mode=tokenize)."""
  root = tmp_path_factory.mktemp("damaged")
  data = root / "wikitext"
  shutil.copytree(os.path.join(REPO, "demo_data", "wikitext"), data)
  cache = root / "cache"
  proc = run_main(
      CONFIG,
      f"--config.data.data_dir={data}",
      f"--config.data.cache_dir={cache}",
      f"--workdir={root / 'tokenize'}",
      "--mode=tokenize",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return data, cache


def _copy(tokenized, tmp_path):
  data, cache = tmp_path / "wikitext", tmp_path / "cache"
  shutil.copytree(tokenized[0], data)
  shutil.copytree(tokenized[1], cache)
  (train,) = [n for n in os.listdir(cache) if ".train." in n]
  return data, cache, train


def test_a_cut_cache_is_rebuilt_by_the_next_training_run(tokenized, tmp_path):
  data, cache, train = _copy(tokenized, tmp_path)
  with np.load(cache / train) as z:
    want = np.asarray(z["tokens"])
  before = {
      n: os.path.getsize(cache / n)
      for n in os.listdir(cache)
      if os.path.isfile(cache / n)
  }
  _cut(cache / train)
  proc = run_main(
      CONFIG,
      f"--config.data.data_dir={data}",
      f"--config.data.cache_dir={cache}",
      "--config.train.num_steps=1",
      "--config.eval.max_windows=2",
      f"--workdir={tmp_path / 'run'}",
      "--mode=train",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"{train} is damaged" in proc.stdout
  with np.load(cache / train) as z:
    np.testing.assert_array_equal(z["tokens"], want)
  assert os.path.getsize(cache / f"{train}.damaged") == before[train] // 2
  after = {
      n: os.path.getsize(cache / n)
      for n in os.listdir(cache)
      if os.path.isfile(cache / n) and not n.endswith(".damaged")
  }
  assert after == before  # Nothing else in the cache touched.


def test_a_cut_cache_without_its_corpus_is_one_line(tokenized, tmp_path):
  data, cache, train = _copy(tokenized, tmp_path)
  _cut(cache / train)
  os.remove(data / "wiki.train.tokens")
  with pytest.raises(errors.DataError, match=f"{train} is damaged"):
    tasks.load_token_stream("wikitext103", str(data), "train", str(cache))
  proc = run_main(
      CONFIG,
      f"--config.data.data_dir={data}",
      f"--config.data.cache_dir={cache}",
      "--config.train.num_steps=1",
      f"--workdir={tmp_path / 'run'}",
      "--mode=train",
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and f"{train} is damaged" in lines[0], lines
  assert not os.path.exists(cache / f"{train}.damaged")
