"""A Hugging Face ``tokenizer.json`` as a memjax vocabulary.

``TokenizerVocabulary`` gives the interface memjax's word vocabulary gives
(``encode``, ``decode``, ``tokens``, ``vocab_size`` and the special ids),
backed by the ``tokenizers`` package: the tokenizer.json is the whole
tokenizer (normaliser, pre-tokeniser, model, decoder), so it encodes as the
model was trained, byte-level BPE or SentencePiece-style alike. Its size
is the model's (``config.json``'s ``vocab_size``), which may exceed the
tokenizer's own (embedding rows padded for speed); the ids past the
tokenizer's have no text.

Text is encoded as the tokenizer's post-processor encodes it (Hugging
Face's ``tok(text)``): a Llama tokenizer puts BOS before it, one that adds
EOS puts it after; GPT-2's adds nothing. ``added_bos`` is the BOS a
tokenizer puts first (None when it adds none): evaluation windows that
start inside a document begin with it (``memjax.data.windows``).
``eos_ids`` are every end-of-sequence id of the model (generation stops at
any of them).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Union

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
      eos: Union[None, int, Sequence[int]] = None,
  ):
    """Reads a tokenizer.json text.

    Args:
      json_text: the tokenizer.json.
      size: V, the model's vocabulary size.
      bos: the model's begin-of-sequence id (``bos_token_id``), or None.
      eos: its end-of-sequence id or ids (``eos_token_id``: Llama 3's
        generation_config.json lists several), or None.

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
    self._size, self._bos = int(size), bos
    if eos is None:
      eos = ()
    elif isinstance(eos, int):
      eos = (eos,)
    self._eos = tuple(int(i) for i in eos)
    own = self.tokenizer.get_vocab_size(with_added_tokens=True)
    if own > self._size:
      raise errors.DataError(
          f"{FILE} has {own} tokens but the model's vocab_size is "
          f"{self._size}: the tokenizer is another model's"
      )
    self._tokens: Optional[tuple[str, ...]] = None
    self._added = self._added_ids()

  def _added_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ids the post-processor puts before a text, ids it puts after)."""
    probe = "a"
    plain = list(self.tokenizer.encode(probe, add_special_tokens=False).ids)
    full = list(self.tokenizer.encode(probe, add_special_tokens=True).ids)
    if not plain:
      return (), ()
    for k in range(len(full) - len(plain) + 1):
      if full[k : k + len(plain)] == plain:
        return tuple(full[:k]), tuple(full[k + len(plain) :])
    return (), ()

  @classmethod
  def load(cls, path: str, info: dict[str, Any]) -> TokenizerVocabulary:
    """The vocabulary of a tokenizer.json file and its ``vocab.json``
    entry (size, bos, eos_ids; an entry written before ``eos_ids`` existed
    holds its one ``eos``)."""
    eos = info.get("eos_ids", info.get("eos"))
    return cls(paths.read_text(path), info["size"], info.get("bos"), eos)

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
        "eos": self.eos_id,
        "eos_ids": list(self._eos),
    }

  @property
  def vocab_size(self) -> int:
    return self._size

  @property
  def bos_id(self) -> Optional[int]:
    return self._bos

  @property
  def eos_id(self) -> Optional[int]:
    """The first end-of-sequence id (None when the model names none)."""
    return self._eos[0] if self._eos else None

  @property
  def eos_ids(self) -> tuple[int, ...]:
    """Every end-of-sequence id: generation stops at any of them."""
    return self._eos

  @property
  def added_bos(self) -> Optional[int]:
    """The BOS id the post-processor puts before a text (one special id
    first), or None."""
    before = self._added[0]
    return before[0] if len(before) == 1 else None

  @property
  def added_eos(self) -> tuple[int, ...]:
    """The ids the post-processor puts after a text (() for none)."""
    return self._added[1]

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
    """Text -> ids, with the special tokens the tokenizer's post-processor
    adds (Hugging Face's ``tok(s)["input_ids"]``)."""
    if isinstance(s, bytes):
      s = s.decode("utf-8")
    return list(self.tokenizer.encode(s, add_special_tokens=True).ids)

  def encode_prompt(self, s: str | bytes) -> list[int]:
    """Text to be continued -> ids: ``encode``'s without the ids the
    post-processor puts after the text (an EOS would end it)."""
    ids = self.encode(s)
    after = len(self.added_eos)
    if after and tuple(ids[-after:]) == self.added_eos:
      ids = ids[:-after]
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Ids -> text (special tokens dropped)."""
    return self.tokenizer.decode([int(i) for i in ids])

  def __repr__(self) -> str:
    return f"TokenizerVocabulary(size={self._size})"
