"""Parallel text: reading and its bad input, the joint vocabulary, the SeqIO
task, token batching, and a vocabulary of another run."""

import os
import shutil

import numpy as np
import pytest

from memjax import settings as settings_lib
from memjax import errors
from memjax.checkpoints import runfiles
from memjax.data import parallel
from memjax.data import token_batching
from memjax.tasks.translation import parts

PAIRS = [
    ("Klicken Sie auf OK.", "Click OK."),
    ("Das Haus ist groß.", "The house is big."),
    ("Er liest ein Buch über Häuser.", "He reads a book about houses."),
    ("Öffnet das Menü Format.", "Opens the Format menu."),
] * 10


def _write(d, split, pairs):
  for i, lang in enumerate(("de", "en")):
    with open(os.path.join(d, f"{split}.{lang}"), "w", encoding="utf-8") as f:
      f.write("\n".join(p[i] for p in pairs) + "\n")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("mt"))
  for split in parallel.SPLITS:
    _write(d, split, PAIRS)
  cache = os.path.join(d, "cache")
  vocab = parallel.train_vocabulary(d, "de", "en", 80, cache)
  return d, cache, vocab


def test_line_counts_must_agree(tmp_path):
  _write(str(tmp_path), "train", PAIRS)
  with open(tmp_path / "train.en", "a") as f:
    f.write("One more line.\n")
  with pytest.raises(errors.DataError, match="40 lines but .* has 41") as e:
    parallel.read_pairs(str(tmp_path), "train", "de", "en")
  assert "\n" not in str(e.value)


def test_empty_line_pair_is_refused(tmp_path):
  pairs = list(PAIRS)
  pairs[3] = ("", "")
  _write(str(tmp_path), "valid", pairs)
  with pytest.raises(errors.DataError, match="empty line 4 in .*valid.de"):
    parallel.read_pairs(str(tmp_path), "valid", "de", "en")


def test_joint_vocabulary_and_task_in_both_directions(data):
  d, cache, vocab_path = data
  vocab = parallel.load_vocabulary(vocab_path)
  assert (vocab.vocab_size, vocab.pad_id, vocab.eos_id) == (80, 0, 1)
  for text in ("Das Haus ist groß.", "He reads a book about houses."):
    assert vocab.decode(vocab.encode(text)) == text
  de_en = parallel.encode_split(d, "valid", "de", "en", vocab_path, cache)
  en_de = parallel.encode_split(d, "valid", "en", "de", vocab_path, cache)
  assert de_en.source_text[1] == "Das Haus ist groß." == en_de.target_text[1]
  np.testing.assert_array_equal(de_en.source[1], en_de.target[1])
  assert de_en.source[1][-1] == 1  # EOS
  assert vocab.decode(de_en.target[1][:-1].tolist()) == "The house is big."


def test_a_copy_and_no_text_files_read_the_cache(data, tmp_path):
  d, cache, vocab_path = data
  encoded = parallel.encode_split(d, "test", "de", "en", vocab_path, cache)
  copy = tmp_path / "copy"
  shutil.copytree(d, copy, ignore=shutil.ignore_patterns("cache"))
  for f in copy.iterdir():
    os.utime(f, (1_000_000_000, 1_000_000_000))
  assert parallel.vocabulary_file(str(copy), "de", "en", 80, cache) == (
      vocab_path
  )
  shutil.rmtree(copy)  # No text files: the cache's records name the files.
  assert parallel.train_vocabulary(str(copy), "de", "en", 80, cache) == (
      vocab_path
  )
  again = parallel.encode_split(
      str(copy), "test", "de", "en", vocab_path, cache
  )
  assert again.source_text == [p[0] for p in PAIRS]  # Kept in the cache.
  assert again.target_text == [p[1] for p in PAIRS]
  for a, b in zip(again.target, encoded.target):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(errors.DataError, match="missing parallel text file"):
    parallel.encode_split(str(copy), "test", "en", "de", vocab_path, cache)


def test_token_batches_cover_an_epoch_once(data):
  d, cache, vocab_path = data
  split = parallel.encode_split(d, "train", "de", "en", vocab_path, cache)
  b = token_batching.TokenBatcher(
      split.source,
      split.target,
      max_tokens=64,
      buckets=(8, 16, 32),
      seed=0,
      row_multiple=2,
  )
  seen = []
  for step in range(b.num_batches):
    batch = b.batch(step)
    rows, length = batch["source"].shape
    assert rows * length <= 64 and rows % 2 == 0
    assert batch["inputs"].shape == batch["targets"].shape
    np.testing.assert_array_equal(
        batch["inputs"][:, 1:], batch["targets"][:, :-1]
    )
    assert np.all(batch["inputs"][:, 0] == token_batching.DECODER_START)
    seen += [tuple(r[r != 0]) for r in batch["targets"] if r.any()]
  assert sorted(seen) == sorted(tuple(t) for t in split.target)
  # A pure function of the step: a fresh batcher asked for the steps in
  # another order (the next epoch's first) gives the same batches, and the
  # next epoch is another shuffle of the same pairs.
  fresh = token_batching.TokenBatcher(
      split.source,
      split.target,
      max_tokens=64,
      buckets=(8, 16, 32),
      seed=0,
      row_multiple=2,
  )
  n = b.num_batches
  for step in (n + 3, 3, n + 1):
    np.testing.assert_array_equal(
        fresh.batch(step)["source"], b.batch(step)["source"], err_msg=step
    )
  epochs = [
      [b.batch(e * n + s)["targets"].tolist() for s in range(n)] for e in (0, 1)
  ]
  assert epochs[0] != epochs[1]
  flat = lambda e: sorted(tuple(r) for batch in e for r in batch)
  assert flat(epochs[0]) == flat(epochs[1])


def test_vocabulary_of_another_run_is_refused(data, tmp_path):
  d, cache, vocab_path = data
  run = str(tmp_path / "run")
  os.makedirs(run)
  other = parallel.train_vocabulary(d, "de", "en", 70, cache)
  runfiles.write_run_files(
      run,
      settings_lib.to_json(trainer_config()),
      parallel.load_vocabulary(other),
  )
  with pytest.raises(
      errors.CheckpointMismatchError, match="not the vocabulary"
  ):
    parts.check_vocabulary(vocab_path, run)
  parts.check_vocabulary(other, run)  # Its own vocabulary is fine.


def trainer_config():
  from configs import trime_iwslt  # pylint: disable=g-import-not-at-top

  return trime_iwslt.get_config("smoke")
