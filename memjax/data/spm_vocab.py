"""Sentencepiece vocabularies (translation, BERT-style MLM), without SeqIO.

:class:`SentencePieceVocabulary` behaves as ``seqio.SentencePieceVocabulary``
(tested in ``tests/data/test_seqio_vocab.py``) but needs only the
``sentencepiece`` package, so a trained translation or encoder model loads,
encodes and decodes without TensorFlow or SeqIO.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from memjax import errors
from memjax.io import paths
from memjax.data.vocab import PAD_ID


class SentencePieceVocabulary:
  """A sentencepiece model (``seqio.SentencePieceVocabulary``'s behaviour).

  Ids are the model's pieces (memjax trains them with pad 0, EOS 1, UNK 2
  and no BOS); ``decode`` stops after the first EOS and maps ids beyond the
  model to UNK, as SeqIO does; an id the model lacks (memjax's BOS) is -1,
  as in sentencepiece and SeqIO. Loading it needs only ``sentencepiece``.

  Attributes:
    sentencepiece_model_file: the model's path.
    tokenizer: the ``sentencepiece.SentencePieceProcessor``.
  """

  def __init__(self, path: str):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    self.sentencepiece_model_file = path
    self.tokenizer = spm.SentencePieceProcessor()
    self.tokenizer.LoadFromSerializedProto(paths.read_bytes(path))

  @property
  def vocab_size(self) -> int:
    return int(self.tokenizer.GetPieceSize())

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def eos_id(self) -> int:
    return int(self.tokenizer.eos_id())

  @property
  def unk_id(self) -> int:
    return int(self.tokenizer.unk_id())

  @property
  def bos_id(self) -> int:
    return int(self.tokenizer.bos_id())

  def encode(self, s: str | bytes) -> list[int]:
    """Piece ids of ``s`` (no EOS added)."""
    s = s.decode("utf-8") if isinstance(s, bytes) else s
    return list(self.tokenizer.EncodeAsIds(s))

  def decode(self, ids: Iterable[int]) -> str:
    """The text of ``ids`` up to the first EOS."""
    ids = [int(i) for i in np.asarray(list(ids)).reshape(-1)]
    n, unk = self.vocab_size, self.tokenizer.unk_id()
    ids = [unk if i >= n else i for i in ids]
    eos = self.eos_id
    if eos >= 0 and eos in ids:
      ids = ids[: ids.index(eos) + 1]
    return self.tokenizer.DecodeIds(ids)

  def __eq__(self, other: object) -> bool:
    return (
        isinstance(other, SentencePieceVocabulary)
        and self.tokenizer.serialized_model_proto()
        == other.tokenizer.serialized_model_proto()
    )

  def __hash__(self) -> int:
    return hash(self.tokenizer.serialized_model_proto())

  def __getstate__(self) -> dict[str, Any]:
    return {"path": self.sentencepiece_model_file}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__init__(state["path"])

  def __repr__(self) -> str:
    return f"SentencePieceVocabulary({self.sentencepiece_model_file!r})"


def load_sentencepiece(path: str) -> SentencePieceVocabulary:
  """The vocabulary of a sentencepiece model file.

  Raises:
    errors.DataError: no file at ``path``.
  """
  if not paths.isfile(path):
    raise errors.DataError(f"no sentencepiece model at {path}")
  return SentencePieceVocabulary(path)
