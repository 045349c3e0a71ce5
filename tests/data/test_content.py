"""memjax.data.content: caches keyed by the corpus files' content, found
from a copy of the corpus or, without it, by the cache's records."""

import hashlib
import os
import shutil
import sys

import pytest

from memjax import build
from memjax import errors
from memjax.data import content
from memjax.data import mlm
from memjax.data import tasks
from memjax.data import vocab as vocab_lib
from tests import shared_runs

TRAIN = "= A =\n\n the cat sat on the mat \n the dog sat \n"


def _write(path, text: str, mtime: int = 0) -> str:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding="utf-8")
  if mtime:
    os.utime(path, (mtime, mtime))
  return str(path)


def _block_tokenizer(monkeypatch) -> None:
  for name in ("seqio", "tensorflow"):
    monkeypatch.setitem(sys.modules, name, None)


def _all_files(root) -> list[str]:
  return sorted(
      os.path.relpath(os.path.join(d, n), root)
      for d, _, names in os.walk(root)
      for n in names
  )


def test_sha256_is_computed_once_per_path_size_and_mtime(tmp_path, monkeypatch):
  path = _write(tmp_path / "data" / "a.txt", "some text\n")
  cache = str(tmp_path / "cache")
  want = hashlib.sha256(b"some text\n").hexdigest()
  assert content.file_sha256(path, cache) == want
  (sidecar,) = os.listdir(tmp_path / "cache" / content.SUBDIR)
  # A new process reads the sidecar: a digest planted there is believed.
  monkeypatch.setattr(content, "_MEMO", {})
  info = os.path.join(tmp_path / "cache" / content.SUBDIR, sidecar)
  planted = open(info).read().replace(want, "f" * 64)
  with open(info, "w") as f:
    f.write(planted)
  assert content.file_sha256(path, cache) == "f" * 64
  # A changed file (new size and mtime) is read again.
  _write(tmp_path / "data" / "a.txt", "other text!\n", mtime=1_000_000_000)
  assert content.file_sha256(path, cache) == (
      hashlib.sha256(b"other text!\n").hexdigest()
  )


def test_a_read_only_cache_keeps_the_sha256_in_memory(tmp_path, monkeypatch):
  path = _write(tmp_path / "data" / "a.txt", "read only\n")

  def refuse(*args, **kwargs):
    raise PermissionError("read-only file system")

  monkeypatch.setattr(content.paths, "write_json", refuse)
  got = content.file_sha256(path, str(tmp_path / "cache"))
  assert got == hashlib.sha256(b"read only\n").hexdigest()
  assert not os.listdir(tmp_path / "cache" / content.SUBDIR)


def test_key_follows_the_bytes_not_the_path_or_mtime(tmp_path):
  cache = str(tmp_path / "cache")
  a = _write(tmp_path / "a" / "x.txt", "same\n")
  b = _write(tmp_path / "b" / "x.txt", "same\n", mtime=1_000_000_000)
  c = _write(tmp_path / "c" / "x.txt", "different\n")
  key = lambda p: content.key("what", lambda: [p], cache, os.path.dirname(p))
  assert key(a) == key(b) != key(c)
  assert len(key(a)) == content.KEY_LENGTH
  assert content.key("other", lambda: [a], cache, "") != key(a)


def test_missing_files_find_the_recorded_key(tmp_path):
  cache = str(tmp_path / "cache")

  def missing():
    raise errors.DataError("missing x.txt")

  with pytest.raises(errors.DataError, match="missing x.txt"):
    content.key("what", missing, cache, "/d1")  # Nothing recorded yet.
  content.record(cache, "what", "/d1", "k1")
  content.record(cache, "else", "/d2", "k9")
  assert content.key("what", missing, cache, "/elsewhere") == "k1"
  content.record(cache, "what", "/d2", "k2")
  assert content.key("what", missing, cache, "/d2") == "k2"  # Its own first.
  with pytest.raises(
      content.AmbiguousCacheError, match="2 different caches of 'what'"
  ):
    content.key("what", missing, cache, "/elsewhere")


def test_word_vocabulary_of_a_copy_and_without_the_corpus(tmp_path):
  cache = str(tmp_path / "cache")
  here = tmp_path / "here"
  _write(here / "wiki.train.tokens", TRAIN)
  vocab = vocab_lib.get_vocabulary("wikitext103", str(here), cache)
  path = vocab_lib.word_vocabulary_path("wikitext103", str(here), cache)
  there = tmp_path / "there"
  _write(there / "wiki.train.tokens", TRAIN, mtime=1_000_000_000)
  assert vocab_lib.word_vocabulary_path("wikitext103", str(there), cache) == (
      path
  )
  os.remove(there / "wiki.train.tokens")
  assert vocab_lib.word_vocabulary_path("wikitext103", str(there), cache) == (
      path
  )
  assert vocab_lib.get_vocabulary("wikitext103", str(there), cache) == vocab
  # Files that are present win: another training text, another vocabulary.
  _write(there / "wiki.train.tokens", TRAIN + " a new line \n")
  other = vocab_lib.get_vocabulary("wikitext103", str(there), cache)
  assert "new" in other.tokens and "new" not in vocab.tokens


def test_a_run_without_seqio_writes_nothing_into_the_cache(
    tmp_path, monkeypatch
):
  data = tmp_path / "data"
  for split in ("train", "valid", "test"):
    _write(data / f"wiki.{split}.tokens", TRAIN)
  cache = tmp_path / "cache"
  _block_tokenizer(monkeypatch)
  with pytest.raises(errors.MissingDependencyError, match="memjax.data."):
    tasks.load_token_stream("wikitext103", str(data), "train", str(cache))
  assert _all_files(cache) == []
  # Translation: its vocabulary is not trained either.
  config = shared_runs.core_config("mt", shared_runs.mt_subset(tmp_path))
  config.data.cache_dir = str(cache)
  run = build.build(config, str(tmp_path / "run"))
  with pytest.raises(errors.MissingDependencyError, match="memjax.data."):
    run.task.load(run.workdir)
  assert _all_files(cache) == []
  assert not os.path.exists(run.workdir)


def test_mlm_caches_of_a_copy_and_without_the_corpus(tmp_path):
  here = shared_runs.core_data("encoder", tmp_path)
  cache = str(tmp_path / "cache")
  vocab = mlm.train_vocabulary(here, shared_runs.BERT_VOCAB, cache)
  ids = mlm.read_split(here, "valid", vocab, cache)
  there = str(tmp_path / "there")
  shutil.copytree(here, there, copy_function=shutil.copyfile)
  assert mlm.vocabulary_file(there, shared_runs.BERT_VOCAB, cache) == vocab
  assert mlm.split_file(there, "valid", vocab, cache) == mlm.split_file(
      here, "valid", vocab, cache
  )
  shutil.rmtree(there)
  assert mlm.train_vocabulary(there, shared_runs.BERT_VOCAB, cache) == vocab
  assert (mlm.read_split(there, "valid", vocab, cache) == ids).all()
  with pytest.raises(errors.DataError, match="wiki.test.tokens"):
    mlm.read_split(there, "test", vocab, cache)  # Never cached.
