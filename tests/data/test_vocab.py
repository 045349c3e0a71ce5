"""Tests of memjax.data.vocab."""

import os
import pickle

import numpy as np
import pytest

from memjax.data import content
from memjax.data import sources
from memjax.data import vocab as vocab_lib

# Word counts: b 3, a 2, c 1, d 1, <unk> 1; c appears before d. Five lines.
TRAIN_TEXT = "b a b\nc a b\n\n<unk> d\n\n"


def _vocab(tmp_path, text=TRAIN_TEXT, min_count=1):
  path = tmp_path / "train.txt"
  path.write_text(text, encoding="utf-8")
  return vocab_lib.WordVocabulary.build(str(path), min_count=min_count)


def test_ids_follow_training_frequency(tmp_path):
  vocab = _vocab(tmp_path)
  assert vocab.tokens == ("<pad>", "<eos>", "<unk>", "b", "a", "c", "d")
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocab.vocab_size == 7
  np.testing.assert_array_equal(vocab.token_counts(), [0, 5, 1, 3, 2, 1, 1])
  assert vocab.token_counts().dtype == np.int64


def test_ties_keep_first_appearance(tmp_path):
  vocab = _vocab(tmp_path, "z y x\nx y z w\n")
  assert vocab.tokens[3:] == ("z", "y", "x", "w")


def test_min_count_moves_rare_words_to_unk(tmp_path):
  vocab = _vocab(tmp_path, min_count=2)
  assert vocab.tokens == ("<pad>", "<eos>", "<unk>", "b", "a")
  # <unk> 1 + c 1 + d 1.
  assert vocab.token_counts()[vocab.unk_id] == 3
  assert vocab.encode("c d a") == [2, 2, 4]


def test_encode_maps_newlines_to_eos_and_unknown_words_to_unk(tmp_path):
  vocab = _vocab(tmp_path)
  assert vocab.encode("b a\n\n c  zzz \n") == [3, 4, 1, 1, 5, 2, 1]
  assert vocab.encode("a b") == [4, 3]  # No newline, no EOS.
  assert vocab.encode("") == []
  assert vocab.encode("\n") == [1]


def test_round_trip_gives_normalised_text(tmp_path):
  vocab = _vocab(tmp_path)
  text = " b  a \n\n\tc d\n b"
  assert vocab.decode(vocab.encode(text)) == "b a\n\nc d\nb"
  # Decoding does not stop at the first EOS and drops padding.
  assert vocab.decode([3, 1, 0, 4, 1, 1, 0]) == "b\na\n\n"
  assert vocab.decode([99]) == "<unk>"


def test_whitespace_set_is_python_str_split():
  expected = tuple(c for c in range(0x110000) if chr(c).isspace())
  assert vocab_lib.WHITESPACE_CODEPOINTS == expected


def test_save_load_round_trip(tmp_path):
  vocab = _vocab(tmp_path)
  path = str(tmp_path / "vocab.txt")
  vocab.save(path)
  lines = open(path, encoding="utf-8").read().splitlines()
  assert [line.split("\t")[0] for line in lines] == list(vocab.tokens)
  loaded = vocab_lib.WordVocabulary.load(path)
  assert loaded == vocab
  assert hash(loaded) == hash(vocab)
  np.testing.assert_array_equal(loaded.token_counts(), vocab.token_counts())


def test_load_without_counts(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("<pad>\n<eos>\n<unk>\nthe\n", encoding="utf-8")
  vocab = vocab_lib.WordVocabulary.load(str(path))
  assert vocab.encode("the cat\n") == [3, 2, 1]
  with pytest.raises(ValueError, match="counts"):
    vocab.token_counts()


def test_vocabulary_without_special_tokens_is_rejected():
  with pytest.raises(ValueError, match="<pad>"):
    vocab_lib.WordVocabulary(["the", "<eos>", "<unk>"])


def test_pickle_keeps_vocabulary_and_encoding(tmp_path):
  vocab = _vocab(tmp_path)
  copy = pickle.loads(pickle.dumps(vocab))
  assert copy == vocab
  assert copy.encode("a b\n") == [4, 3, 1]


def test_byte_vocabulary_id_layout():
  vocab = vocab_lib.byte_vocabulary()
  assert vocab.vocab_size == 259 == vocab_lib.BYTE_VOCAB_SIZE
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocab.encode("A\n") == [ord("A") + 3, ord("\n") + 3]
  raw = bytes([0, 65, 0xC3, 0xFF, 255, 10])  # Not valid UTF-8.
  ids = vocab_lib.encode_bytes(raw)
  np.testing.assert_array_equal(ids, [3, 68, 198, 258, 258, 13])
  assert vocab_lib.decode_bytes(ids) == raw
  # Decoding stops at EOS and drops the other special ids.
  assert vocab.decode([3 + ord("h"), 0, 3 + ord("i"), 1, 3 + ord("x")]) == "hi"


def test_get_vocabulary_builds_once_and_caches_a_file(tmp_path):
  data_dir = tmp_path / "wt"
  data_dir.mkdir()
  (data_dir / "wiki.train.tokens").write_text(TRAIN_TEXT, encoding="utf-8")
  cache_dir = tmp_path / "cache"
  vocab = vocab_lib.get_vocabulary("wikitext", str(data_dir), str(cache_dir))
  assert vocab.tokens[3:] == ("b", "a", "c", "d")
  cached = sorted(os.listdir(cache_dir))
  assert cached[0] == content.SUBDIR  # The training file's SHA-256.
  cached = cached[1:]
  assert len(cached) == 1 and cached[0].startswith("wikitext103.vocab.")
  assert vocab_lib.WordVocabulary.load(str(cache_dir / cached[0])) == vocab
  again = vocab_lib.get_vocabulary("wikitext103", str(data_dir), None)
  assert again == vocab


def test_get_vocabulary_defaults_to_a_cache_inside_the_data_dir(tmp_path):
  (tmp_path / "wiki.train.tokens").write_text("x y\n", encoding="utf-8")
  vocab_lib.get_vocabulary("wikitext103", str(tmp_path), None)
  cache = tmp_path / sources.CACHE_SUBDIR
  names = sorted(os.listdir(cache))
  assert names[0] == content.SUBDIR
  assert [f.startswith("wikitext103.vocab.") for f in names[1:]] == [True]


def test_get_vocabulary_of_byte_corpora():
  for corpus in ("enwik8", "text8"):
    vocab = vocab_lib.get_vocabulary(corpus, "/nonexistent", None)
    assert isinstance(vocab, vocab_lib.ByteVocabulary)
