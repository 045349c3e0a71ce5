"""A Hugging Face ``tokenizer.json`` as a memjax vocabulary.

``TokenizerVocabulary`` gives the interface memjax's word vocabulary gives
(``encode``, ``decode``, ``tokens``, ``vocab_size`` and the special ids),
backed by the ``tokenizers`` package: the tokenizer.json is the whole
tokenizer (normaliser, pre-tokeniser, model, decoder), so it encodes as the
model was trained, byte-level BPE or SentencePiece-style alike. Its size
is the model's (``config.json``'s ``vocab_size``), which may exceed the
tokenizer's own (embedding rows padded for speed); the ids past the
tokenizer's have no text.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from memjax import errors
from memjax.io import optional
from memjax.io import paths

FILE = "tokenizer.json"


class TokenizerVocabulary:
  """A ``tokenizers.Tokenizer`` with memjax's vocabulary interface.

  Attributes:
    tokenizer: the ``tokenizers.Tokenizer``.
    json_text: its tokenizer.json, as read.
  """

  def __init__(
      self,
      json_text: str,
      size: int,
      bos: Optional[int] = None,
      eos: Optional[int] = None,
  ):
    """Reads a tokenizer.json text.

    Args:
      json_text: the tokenizer.json.
      size: V, the model's vocabulary size.
      bos, eos: the model's begin- and end-of-sequence ids (config.json's
        ``bos_token_id``, ``eos_token_id``), or None.

    Raises:
      errors.DataError: a text the tokenizers package cannot read, or a
        tokenizer with more ids than the model.
    """
    tk = optional.require("tokenizers", "reading a pretrained tokenizer")
    try:
      self.tokenizer = tk.Tokenizer.from_str(json_text)
    except Exception as e:  # The package's errors have no common base.
      raise errors.DataError(f"{FILE} is not a readable tokenizer: {e}")
    self.json_text = json_text
    self._size, self._bos, self._eos = int(size), bos, eos
    own = self.tokenizer.get_vocab_size(with_added_tokens=True)
    if own > self._size:
      raise errors.DataError(
          f"{FILE} has {own} tokens but the model's vocab_size is "
          f"{self._size}: the tokenizer is another model's"
      )
    self._tokens: Optional[tuple[str, ...]] = None

  @classmethod
  def load(cls, path: str, info: dict[str, Any]) -> TokenizerVocabulary:
    """The vocabulary of a tokenizer.json file and its ``vocab.json``
    entry (size, bos, eos)."""
    return cls(
        paths.read_text(path), info["size"], info.get("bos"), info.get("eos")
    )

  def save(self, path: str) -> None:
    """Writes the tokenizer.json to ``path``."""
    paths.write_text(path, self.json_text)

  def info(self) -> dict[str, Any]:
    """Its ``vocab.json`` entry (``memjax.checkpoints.runfiles``)."""
    return {
        "kind": "tokenizer",
        "file": FILE,
        "size": self._size,
        "bos": self._bos,
        "eos": self._eos,
    }

  @property
  def vocab_size(self) -> int:
    return self._size

  @property
  def bos_id(self) -> Optional[int]:
    return self._bos

  @property
  def eos_id(self) -> Optional[int]:
    return self._eos

  @property
  def unk_id(self) -> Optional[int]:
    return None

  @property
  def pad_id(self) -> Optional[int]:
    return None

  @property
  def tokens(self) -> tuple[str, ...]:
    """Each id's token string ('' for the padded ids past the tokenizer's)."""
    if self._tokens is None:
      get = self.tokenizer.id_to_token
      self._tokens = tuple(get(i) or "" for i in range(self._size))
    return self._tokens

  def encode(self, s: str | bytes) -> list[int]:
    """Text -> ids, without the special tokens the tokenizer may add."""
    if isinstance(s, bytes):
      s = s.decode("utf-8")
    return list(self.tokenizer.encode(s, add_special_tokens=False).ids)

  def decode(self, ids: Iterable[int]) -> str:
    """Ids -> text (special tokens dropped)."""
    return self.tokenizer.decode([int(i) for i in ids])

  def __repr__(self) -> str:
    return f"TokenizerVocabulary(size={self._size})"
