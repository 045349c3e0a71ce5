"""memjax's vocabularies as ``seqio.Vocabulary`` objects, for SeqIO tasks.

``memjax.data.vocab`` holds the vocabularies a trained model uses, in plain
Python; SeqIO's features need ``seqio.Vocabulary`` objects that also encode
inside tf.data. :func:`to_seqio` gives SeqIO's own ``ByteVocabulary`` and
``SentencePieceVocabulary`` for bytes and sentencepiece models, and a
:class:`SeqioWordVocabulary` (TensorFlow lookup tables) for word
vocabularies. Importing this module imports SeqIO and TensorFlow (with the
accelerators hidden from it, ``memjax.io.optional.tensorflow``).
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

import numpy as np

from memjax.io import optional
from memjax.data import spm_vocab
from memjax.data import vocab as vocab_lib

tf = optional.tensorflow("a SeqIO task")
seqio = optional.require("seqio", "a SeqIO task")

_WHITESPACE_RE2 = (
    "["
    + "".join(f"\\x{{{c:x}}}" for c in vocab_lib.WHITESPACE_CODEPOINTS)
    + "]+"
)


class SeqioWordVocabulary(seqio.Vocabulary):
  """A ``vocab.WordVocabulary`` as a ``seqio.Vocabulary``.

  ``encode``/``decode`` are the word vocabulary's (decoding does not stop at
  EOS: EOS is a line break); ``encode_tf``/``decode_tf`` give the same ids
  and text inside TensorFlow graphs (tested against the Python ones).
  """

  def __init__(self, words: vocab_lib.WordVocabulary):
    self.words = words
    self._tf_lock = threading.Lock()
    self._tf_tables: tuple[Any, Any] | None = None
    super().__init__(extra_ids=0)

  @property
  def bos_id(self) -> int | None:
    return None

  @property
  def eos_id(self) -> int:
    return vocab_lib.EOS_ID

  @property
  def unk_id(self) -> int:
    return vocab_lib.UNK_ID

  @property
  def pad_id(self) -> int:
    return vocab_lib.PAD_ID

  @property
  def _base_vocab_size(self) -> int:
    return self.words.vocab_size

  def _encode(self, s: str | bytes) -> list[int]:
    return self.words.encode(s)

  def decode(self, ids: Iterable[int]) -> str:
    """Detokenizes ids to text; EOS -> '\\n', PAD dropped, no truncation."""
    if isinstance(ids, tf.Tensor):
      ids = np.asarray(ids)
    return self.words.decode(ids)

  def _decode(self, ids: Iterable[int]) -> str:
    return self.words.decode(ids)

  def _tables(self) -> tuple[Any, Any]:
    """Returns (word -> id table, id -> string tensor), built once.

    They are built eagerly (``tf.init_scope``) even when first needed
    while tracing a tf.data map function, so every graph shares them.
    """
    with self._tf_lock:
      if self._tf_tables is None:
        tokens = self.words.tokens
        with tf.init_scope():
          keys = tf.constant(tokens, dtype=tf.string)
          table = tf.lookup.StaticHashTable(
              tf.lookup.KeyValueTensorInitializer(
                  keys, tf.range(len(tokens), dtype=tf.int32)
              ),
              default_value=vocab_lib.UNK_ID,
          )
          # Decode strings: EOS becomes a newline, PAD nothing.
          out = list(tokens)
          out[vocab_lib.PAD_ID], out[vocab_lib.EOS_ID] = "", "\n"
          self._tf_tables = (table, tf.constant(out, tf.string))
      return self._tf_tables

  def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    """Encodes a scalar tf.string into a [N] int32 tensor."""
    table, _ = self._tables()
    s = tf.convert_to_tensor(s, dtype=tf.string)
    lines = tf.strings.split(s, "\n")  # [num_lines]
    lines = tf.strings.regex_replace(lines, _WHITESPACE_RE2, " ")
    words = tf.strings.split(lines)  # ragged [num_lines, None]
    ids = tf.ragged.map_flat_values(table.lookup, words)
    eos = tf.fill(tf.stack([tf.shape(lines, tf.int64)[0], 1]), 1)
    ids = tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1)
    # Every line is followed by EOS except the last (no '\n' after it).
    return ids.flat_values[:-1]

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    """Detokenizes [..., N] ids to [...] strings (no truncation at EOS)."""
    ids = tf.convert_to_tensor(ids)
    if ids.shape == (0,):
      return tf.constant(b"", dtype=tf.string)
    in_range = tf.logical_and(ids >= 0, ids < self._base_vocab_size)
    ids = tf.where(in_range, ids, tf.cast(vocab_lib.UNK_ID, ids.dtype))
    return self._decode_tf(ids)

  def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    _, strings = self._tables()
    text = tf.strings.reduce_join(
        tf.gather(strings, ids), axis=-1, separator=" "
    )
    text = tf.strings.regex_replace(text, " +", " ")  # dropped PADs
    text = tf.strings.regex_replace(text, " ?\n ?", "\n")
    return tf.strings.regex_replace(text, "^ | $", "")

  def __eq__(self, other: object) -> bool:
    return isinstance(other, SeqioWordVocabulary) and self.words == other.words

  def __hash__(self) -> int:
    return hash(self.words)

  def __getstate__(self) -> dict[str, Any]:
    return {"words": self.words}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__init__(state["words"])

  def __repr__(self) -> str:
    return f"SeqioWordVocabulary(vocab_size={self.vocab_size})"


def to_seqio(vocab: Any) -> seqio.Vocabulary:
  """The ``seqio.Vocabulary`` of one of ``memjax.data.vocab``'s vocabularies.

  Raises:
    TypeError: not a memjax vocabulary.
  """
  if isinstance(vocab, vocab_lib.WordVocabulary):
    return SeqioWordVocabulary(vocab)
  if isinstance(vocab, vocab_lib.ByteVocabulary):
    return seqio.ByteVocabulary()
  if isinstance(vocab, spm_vocab.SentencePieceVocabulary):
    return seqio.SentencePieceVocabulary(vocab.sentencepiece_model_file)
  raise TypeError(f"not a memjax vocabulary: {vocab!r}")
