"""Vocabularies: a word vocabulary for WikiText-103, bytes for enwik8/text8.

Word vocabulary id layout (WikiText practice, as in fairseq and
Transformer-XL)::

    0  <pad>   padding (never produced by encode)
    1  <eos>   end of line: every '\\n' of the text becomes one EOS
    2  <unk>   unknown word (WikiText already contains '<unk>' tokens)
    3  ...     words by descending training count, ties by first appearance

The frequency order matters: adaptive-softmax / adaptive-input cut-offs
assume that low ids are frequent words.

Byte vocabulary id layout (seqio.ByteVocabulary, as ByT5)::

    0 <pad>, 1 <eos>, 2 <unk>, 3 + b for byte b in 0..255  (259 ids)

Byte corpora are encoded on the raw bytes (:func:`encode_bytes`, as
``seqio.ByteVocabulary.encode_tf``), so every byte of enwik8 is kept (the
Python ``encode`` takes str and re-encodes as UTF-8, which cannot represent
invalid byte sequences).

The vocabularies here (and ``spm_vocab``'s sentencepiece models) are plain
Python: a trained model encodes and decodes without TensorFlow or SeqIO. SeqIO tasks wrap them as
``seqio.Vocabulary`` objects in ``memjax.data.seqio_vocab``; the ids are the
same (tested), so token caches and checkpoints do not depend on which one
made them.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Iterable, Sequence

import numpy as np

from memjax.io import paths
from memjax.data import content
from memjax.data import sources

PAD_ID: int = 0
EOS_ID: int = 1
UNK_ID: int = 2
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<eos>", "<unk>")
EOS_TOKEN: str = SPECIAL_TOKENS[EOS_ID]
UNK_TOKEN: str = SPECIAL_TOKENS[UNK_ID]

# seqio.ByteVocabulary reserves 0=PAD, 1=EOS, 2=UNK; byte b has id b + 3.
BYTE_OFFSET: int = 3
BYTE_VOCAB_SIZE: int = 256 + BYTE_OFFSET

# The characters Python's str.split() splits on (exactly those with
# str.isspace()), spelled out so that the TensorFlow encoder splits on the
# same set: tf.strings.split splits on ASCII whitespace only.
WHITESPACE_CODEPOINTS: tuple[int, ...] = (
    0x09,
    0x0A,
    0x0B,
    0x0C,
    0x0D,
    0x1C,
    0x1D,
    0x1E,
    0x1F,
    0x20,
    0x85,
    0xA0,
    0x1680,
    0x2000,
    0x2001,
    0x2002,
    0x2003,
    0x2004,
    0x2005,
    0x2006,
    0x2007,
    0x2008,
    0x2009,
    0x200A,
    0x2028,
    0x2029,
    0x202F,
    0x205F,
    0x3000,
)  # pyformat: disable


def count_words(lines: Iterable[str]) -> tuple[list[str], list[int]]:
  """Counts words and EOS symbols of text lines.

  Args:
      lines: text pieces, each ending in at most one '\\n' (e.g. the lines
          of a file opened with ``newline='\\n'``).

  Returns:
      (tokens, counts): the vocabulary in id order (specials first, then
      words by descending count, ties by first appearance) and the count of
      each token. The EOS count is the number of '\\n'; literal '<unk>'
      words count towards UNK.
  """
  counter: collections.Counter[str] = collections.Counter()
  num_eos = 0
  for line in lines:
    counter.update(line.split())
    if line.endswith("\n"):
      num_eos += 1
  special_counts = [counter.pop(t, 0) for t in SPECIAL_TOKENS]
  special_counts[EOS_ID] += num_eos
  # Counter keeps first-appearance order and sorted() is stable, so ties
  # keep the order in which the words first appear.
  words = sorted(counter.items(), key=lambda kv: -kv[1])
  tokens = list(SPECIAL_TOKENS) + [w for w, _ in words]
  counts = special_counts + [c for _, c in words]
  return tokens, counts


class WordVocabulary:
  """Whitespace-split word vocabulary with one EOS per line.

  ``encode(text)`` splits each line on whitespace (Python ``str.split``
  semantics) and maps every '\\n' to EOS; a last line without '\\n' gets no
  EOS. Unknown words map to UNK. ``decode(ids)`` joins words with single
  spaces, turns EOS into '\\n' and drops PAD, so decoding an encoding gives
  the text with each line's whitespace normalised. Unlike a
  ``seqio.Vocabulary``, decoding does not stop at the first EOS: EOS is a
  line break here, not the end of a sequence. The TensorFlow encoder of the
  SeqIO tasks is ``seqio_vocab.SeqioWordVocabulary``.
  """

  def __init__(
      self, tokens: Sequence[str], counts: Sequence[int] | None = None
  ):
    """Creates the vocabulary.

    Args:
        tokens: all tokens in id order; the first three must be '<pad>',
            '<eos>', '<unk>'. Tokens must be unique and free of whitespace.
        counts: optional training count of each token.

    Raises:
        ValueError: malformed token list or counts.
    """
    tokens = tuple(tokens)
    if tokens[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
      raise ValueError(
          f"A word vocabulary must start with {SPECIAL_TOKENS}, got "
          f"{tokens[:len(SPECIAL_TOKENS)]}."
      )
    self._tokens = tokens
    self._ids = {t: i for i, t in enumerate(tokens)}
    if len(self._ids) != len(tokens):
      raise ValueError("Vocabulary tokens are not unique.")
    for t in tokens:
      if not t or len(t.split()) != 1 or t.split()[0] != t:
        raise ValueError(f"Token {t!r} is empty or has whitespace.")
    self._counts = None
    if counts is not None:
      self._counts = np.asarray(counts, dtype=np.int64)
      if self._counts.shape != (len(tokens),):
        raise ValueError(
            f"Got {self._counts.shape[0]} counts for {len(tokens)} " "tokens."
        )
    self._hash = hash(self._tokens)

  # --- construction and files -------------------------------------------

  @classmethod
  def build(cls, train_path: str, min_count: int = 1) -> WordVocabulary:
    """Builds the vocabulary of a training file.

    Args:
        train_path: UTF-8 text file (e.g. ``wiki.train.tokens``).
        min_count: words seen fewer times are left out (they encode as
            UNK and their counts are added to UNK's).

    Returns:
        The vocabulary, with training counts.
    """
    text = sources.read_utf8(train_path)
    tokens, counts = count_words(sources.split_lines(text))
    return cls._from_counts(tokens, counts, min_count)

  @classmethod
  def from_text(cls, text: str, min_count: int = 1) -> WordVocabulary:
    """Builds the vocabulary of ``text`` (as :meth:`build` on a file)."""
    tokens, counts = count_words(sources.split_lines(text))
    return cls._from_counts(tokens, counts, min_count)

  @classmethod
  def _from_counts(
      cls, tokens: list[str], counts: list[int], min_count: int
  ) -> WordVocabulary:
    n = len(SPECIAL_TOKENS)
    keep = [i for i in range(n, len(tokens)) if counts[i] >= min_count]
    dropped = sum(counts[n:]) - sum(counts[i] for i in keep)
    counts = list(counts[:n]) + [counts[i] for i in keep]
    counts[UNK_ID] += dropped
    return cls(list(tokens[:n]) + [tokens[i] for i in keep], counts)

  def save(self, path: str) -> None:
    """Writes one token per line, followed by a tab and its count if known.

    The write is whole (``paths.write_text``: a local file through a
    temporary file and a rename).
    """
    if self._counts is None:
      text = "".join(f"{t}\n" for t in self._tokens)
    else:
      text = "".join(f"{t}\t{c}\n" for t, c in zip(self._tokens, self._counts))
    paths.write_text(path, text)

  @classmethod
  def load(cls, path: str) -> WordVocabulary:
    """Reads a file written by :meth:`save`.

    Lines are ``token`` or ``token<whitespace>count`` (so fairseq-style
    ``dict.txt`` lines parse too, given the three special tokens first).
    """
    tokens, counts = [], []
    with paths.open(path, "r", encoding="utf-8", newline="\n") as f:
      for line_no, line in enumerate(f, 1):
        fields = line.split()
        if not fields:
          continue
        if len(fields) > 2:
          raise ValueError(
              f"{path}:{line_no}: expected 'token' or 'token count'."
          )
        tokens.append(fields[0])
        counts.append(int(fields[1]) if len(fields) == 2 else None)
    has_counts = all(c is not None for c in counts)
    return cls(tokens, counts if has_counts else None)

  # --- the seqio.Vocabulary API ------------------------------------------

  @property
  def bos_id(self) -> int | None:
    return None

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def unk_id(self) -> int:
    return UNK_ID

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def vocab_size(self) -> int:
    return len(self._tokens)

  @property
  def tokens(self) -> tuple[str, ...]:
    """All tokens in id order."""
    return self._tokens

  def token_counts(self) -> np.ndarray:
    """Training count of each id: [V] int64 (EOS = number of lines).

    Raises:
        ValueError: the vocabulary was loaded from a file without counts.
    """
    if self._counts is None:
      raise ValueError("This vocabulary has no training counts.")
    return self._counts.copy()

  def token_to_id(self, token: str) -> int:
    """Id of ``token``; UNK for unknown tokens."""
    return self._ids.get(token, UNK_ID)

  def id_to_token(self, token_id: int) -> str:
    """Token of ``token_id``; '<unk>' for ids out of range."""
    if 0 <= token_id < len(self._tokens):
      return self._tokens[token_id]
    return UNK_TOKEN

  def encode(self, s: str | bytes) -> list[int]:
    """Ids of ``s``: words of each line, EOS for every '\\n' (no EOS added)."""
    if isinstance(s, bytes):
      s = s.decode("utf-8")
    lookup = self._ids.get
    lines = s.split("\n")
    ids: list[int] = []
    for line in lines[:-1]:
      ids.extend(lookup(w, UNK_ID) for w in line.split())
      ids.append(EOS_ID)
    ids.extend(lookup(w, UNK_ID) for w in lines[-1].split())
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Detokenizes ids to text; EOS -> '\\n', PAD dropped, no truncation."""
    if not isinstance(ids, (list, tuple)):
      ids = np.asarray(ids).reshape(-1).tolist()
    parts: list[str] = []
    line: list[str] = []
    for i in ids:
      i = int(i)
      if i == PAD_ID:
        continue
      if i == EOS_ID:
        parts.append(" ".join(line) + "\n")
        line = []
      else:
        line.append(self.id_to_token(i))
    if line:
      parts.append(" ".join(line))
    return "".join(parts)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, WordVocabulary) and self._tokens == other._tokens

  def __hash__(self) -> int:
    return self._hash

  def __repr__(self) -> str:
    return f"WordVocabulary(vocab_size={self.vocab_size})"


class ByteVocabulary:
  """Bytes as ids (``seqio.ByteVocabulary``'s layout and behaviour).

  ``encode(text)`` gives the UTF-8 bytes of ``text`` as ids b + 3;
  ``decode(ids)`` stops after the first EOS (as a ``seqio.Vocabulary``),
  drops the special ids and decodes the bytes as UTF-8, skipping invalid
  sequences.
  """

  vocab_size: int = BYTE_VOCAB_SIZE
  pad_id: int = PAD_ID
  eos_id: int = EOS_ID
  unk_id: int = UNK_ID
  bos_id: int | None = None

  def encode(self, s: str | bytes) -> list[int]:
    """Ids of the UTF-8 bytes of ``s`` (no EOS added)."""
    data = s if isinstance(s, bytes) else s.encode("utf-8")
    return encode_bytes(data).tolist()

  def decode(self, ids: Iterable[int]) -> str:
    """The text of ``ids`` up to the first EOS."""
    ids = [int(i) for i in np.asarray(list(ids)).reshape(-1)]
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID)]
    return decode_bytes(ids).decode("utf-8", errors="ignore")

  def __eq__(self, other: object) -> bool:
    return isinstance(other, ByteVocabulary)

  def __hash__(self) -> int:
    return hash(ByteVocabulary)

  def __repr__(self) -> str:
    return "ByteVocabulary(vocab_size=259)"


def byte_vocabulary() -> ByteVocabulary:
  """The byte vocabulary of enwik8/text8: byte b -> id b + 3 (259 ids)."""
  return ByteVocabulary()


def encode_bytes(data: bytes) -> np.ndarray:
  """Byte ids of raw bytes, as ``ByteVocabulary.encode_tf``: [N] int32."""
  return np.frombuffer(data, dtype=np.uint8).astype(np.int32) + BYTE_OFFSET


def decode_bytes(ids: np.ndarray | Sequence[int]) -> bytes:
  """Raw bytes of byte ids; special ids (PAD/EOS/UNK) are dropped."""
  ids = np.asarray(ids, dtype=np.int64).reshape(-1)
  ids = ids[(ids >= BYTE_OFFSET) & (ids < BYTE_VOCAB_SIZE)]
  return (ids - BYTE_OFFSET).astype(np.uint8).tobytes()


# Built vocabularies by cache file (named by the training file's content)
# and min_count, so that tasks and token streams of one process share one
# object.
_VOCAB_MEMO: dict[tuple[Any, ...], WordVocabulary] = {}
_VOCAB_MEMO_LOCK = threading.Lock()

# Bump when the vocabulary files change.
_VOCAB_CACHE_VERSION = 2


def word_vocabulary_path(
    corpus: str,
    data_dir: str,
    cache_dir: str | None,
    min_count: int = 1,
    remember: bool = True,
) -> str:
  """Cache file of the word vocabulary of ``corpus`` in ``data_dir``.

  The name holds a hash of the training file's bytes and of ``min_count``
  (``content.key``), so a changed training file gets a new vocabulary and a
  copied one finds its own. With the training file missing it is the one
  recorded in the cache; ``remember=False`` writes no sidecar.

  Raises:
    sources.DataError: the training file is missing and the cache holds no
        record of its vocabulary.
  """
  corpus = sources.canonical_corpus(corpus)
  directory = sources.resolve_cache_dir(cache_dir, data_dir)
  key = word_vocabulary_key(corpus, data_dir, directory, min_count, remember)
  return paths.join(directory, f"{corpus}.vocab.{key}.txt")


def word_vocabulary_key(
    corpus: str,
    data_dir: str,
    cache_dir: str,
    min_count: int = 1,
    remember: bool = True,
) -> str:
  """The ``content.key`` in the name of ``word_vocabulary_path``."""
  corpus = sources.canonical_corpus(corpus)
  return content.key(
      vocabulary_what(corpus, min_count),
      lambda: [sources.split_path(corpus, data_dir, "train")],
      cache_dir,
      paths.resolve(data_dir),
      remember,
  )


def vocabulary_what(corpus: str, min_count: int) -> str:
  """The ``content.key`` description of a word vocabulary."""
  return f"vocabulary v{_VOCAB_CACHE_VERSION} {corpus} min_count={min_count}"


def get_vocabulary(
    corpus: str,
    data_dir: str,
    cache_dir: str | None = None,
    min_count: int = 1,
    remember: bool = True,
) -> WordVocabulary | ByteVocabulary:
  """Returns the vocabulary of ``corpus``.

  Args:
      corpus: 'wikitext103' (or an alias), 'enwik8' or 'text8'.
      data_dir: directory with the corpus files.
      cache_dir: where the word vocabulary file is cached; None uses
          ``<data_dir>/memjax_cache`` if ``data_dir`` is writable, else a
          folder in the system temp dir.
      min_count: minimum training count of a word (word corpora only).
      remember: keep the training file's SHA-256 in the cache's sidecar
          (``content.file_sha256``; False: read a cached vocabulary
          writing nothing).

  Returns:
      A :class:`WordVocabulary` built from the training split (read from the
      cache file when present) for WikiText, ``byte_vocabulary()`` for
      enwik8 and text8.

  Raises:
      sources.DataError: unknown corpus, missing directory or training file.
  """
  spec = sources.corpus_spec(corpus)
  if spec.level == "byte":
    return byte_vocabulary()
  path = word_vocabulary_path(
      spec.name, data_dir, cache_dir, min_count, remember
  )
  # The cache file is part of the key: another cache directory gets its file.
  memo_key = (path, min_count)
  with _VOCAB_MEMO_LOCK:
    if memo_key in _VOCAB_MEMO:
      return _VOCAB_MEMO[memo_key]
    if paths.isfile(path):
      vocab = WordVocabulary.load(path)
    else:
      train = sources.split_path(spec.name, data_dir, "train")
      print(f"memjax.data: building the vocabulary of {train}", flush=True)
      vocab = WordVocabulary.from_text(
          sources.read_text(spec.name, data_dir, "train"), min_count
      )
      vocab.save(path)
      content.record(
          paths.dirname(path),
          vocabulary_what(spec.name, min_count),
          paths.resolve(data_dir),
          path.rsplit(".", 2)[-2],
      )
    _VOCAB_MEMO[memo_key] = vocab
    return vocab
