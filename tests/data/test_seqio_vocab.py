"""Tests of memjax.data.seqio_vocab: SeqIO's view of memjax's vocabularies
gives the same ids and text as the plain vocabularies a trained model uses."""

import os
import pickle

import numpy as np
import seqio
import tensorflow as tf

from memjax.data import parallel
from memjax.data import seqio_vocab
from memjax.data import vocab as vocab_lib

TRAIN_TEXT = "b a b\nc a b\n\n<unk> d\n\n"


def _words(tmp_path) -> seqio_vocab.SeqioWordVocabulary:
  path = tmp_path / "train.txt"
  path.write_text(TRAIN_TEXT, encoding="utf-8")
  words = vocab_lib.WordVocabulary.build(str(path))
  return seqio_vocab.to_seqio(words)


def test_tensorflow_encoding_equals_python_encoding(tmp_path):
  vocab = _words(tmp_path)
  texts = [
      "",
      "b",
      "b\n",
      "\n\n",
      " b\ta \n c\u00a0d\u3000a\x0bb \n\nzzz",
      "a\r\nb\n",
  ]
  for text in texts:
    expected = vocab.words.encode(text)
    assert vocab.encode(text) == expected, text
    got = vocab.encode_tf(tf.constant(text)).numpy().tolist()
    assert got == expected, text


def test_tensorflow_decoding_equals_python_decoding(tmp_path):
  vocab = _words(tmp_path)
  ids = [[3, 4, 1, 1, 5], [0, 6, 1, 3, 0]]
  got = vocab.decode_tf(tf.constant(ids)).numpy().tolist()
  assert [g.decode() for g in got] == [vocab.words.decode(i) for i in ids]
  assert vocab.decode(ids[0]) == "b a\n\nc"  # No truncation at EOS.
  assert vocab.vocab_size == vocab.words.vocab_size == 7


def test_pickle_keeps_vocabulary_and_encoding(tmp_path):
  vocab = _words(tmp_path)
  vocab.encode_tf(tf.constant("a"))  # Builds the tf tables.
  copy = pickle.loads(pickle.dumps(vocab))
  assert copy == vocab
  assert copy.encode_tf(tf.constant("a b\n")).numpy().tolist() == [4, 3, 1]


def test_bytes_match_seqio_byte_vocabulary():
  ours, theirs = vocab_lib.byte_vocabulary(), seqio.ByteVocabulary()
  assert isinstance(seqio_vocab.to_seqio(ours), seqio.ByteVocabulary)
  assert ours.vocab_size == theirs.vocab_size
  raw = bytes([0, 65, 0xC3, 0xFF, 255, 10])  # Not valid UTF-8.
  np.testing.assert_array_equal(
      vocab_lib.encode_bytes(raw), theirs.encode_tf(tf.constant(raw)).numpy()
  )
  for text in ("", "A\n", "größer\u3000x"):
    assert ours.encode(text) == list(theirs.encode(text))
  for ids in ([3, 68, 1, 70], [0, 2, 68, 300, 69], [198, 3 + 0xA4, 1]):
    assert ours.decode(ids) == theirs.decode(ids), ids


def test_sentencepiece_matches_seqio(tmp_path):
  d = str(tmp_path)
  pairs = ["Das Haus ist groß.", "Er liest ein Buch über Häuser."] * 20
  for split in parallel.SPLITS:
    for lang in ("de", "en"):
      with open(os.path.join(d, f"{split}.{lang}"), "w") as f:
        f.write("\n".join(pairs) + "\n")
  path = parallel.train_vocabulary(d, "de", "en", 60, os.path.join(d, "c"))
  ours = parallel.load_vocabulary(path)
  theirs = seqio_vocab.to_seqio(ours)
  assert isinstance(theirs, seqio.SentencePieceVocabulary)
  assert (ours.vocab_size, ours.eos_id, ours.unk_id, ours.bos_id) == (
      theirs.vocab_size,
      theirs.eos_id,
      theirs.unk_id,
      theirs.bos_id,
  )
  for text in pairs[:2] + ["Unbekannte Wörter!"]:
    assert ours.encode(text) == list(theirs.encode(text))
  ids = ours.encode("Das Haus") + [1] + ours.encode("Buch") + [500]
  assert ours.decode(ids) == theirs.decode(ids) == "Das Haus"
  assert ours.decode([*ours.encode("Buch"), 500]) == theirs.decode(
      [*ours.encode("Buch"), 500]
  )
  assert pickle.loads(pickle.dumps(ours)) == ours
