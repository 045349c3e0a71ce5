"""Masked-LM data: a subword vocabulary, token streams, BERT's masking.

* ``train_vocabulary``: a sentencepiece model (BPE) trained on the
  pretraining corpus's training split, wrapped as a
  ``seqio.SentencePieceVocabulary`` (pad 0, EOS 1, UNK 2, no BOS, as
  ``memjax.data.parallel``), with two reserved pieces: ``[CLS]`` (the
  classifier reads this first position) and ``[MASK]``.
* ``read_split``: WikiText's paragraphs (headings left out, its ``@-@``
  style escapes undone so the vocabulary also reads ordinary text) encoded
  into one id stream with EOS between paragraphs (RoBERTa's FULL-SENTENCES
  packing, no next-sentence task), cached per split as ``.npy``.
* ``mask_tokens``: Devlin et al.'s corruption: each real token is chosen
  with probability ``mask_prob`` (15%); a chosen token becomes ``[MASK]``
  80% of the time, a random ordinary piece 10%, stays itself 10%; the loss
  weight is 1 exactly at the chosen positions.
* ``MLMBatcher`` (the 'mlm' batcher of ``memjax.tasks.mlm``): rows ``[CLS]`` + a
  random window of ``data.seq_len - 1`` stream tokens, masked; a pure
  function of (seed, step).
"""

from __future__ import annotations

import numpy as np

from memjax import errors
from memjax.io import paths
from memjax.data import cache_files
from memjax.data import content
from memjax.data import parallel
from memjax.data import sources

CLS, MASK = "[CLS]", "[MASK]"
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
DEFAULT_DIR = paths.join(sources.DEMO_DATA_DIR, "wikitext")
_ESCAPES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))
_CACHE_VERSION = 2


def split_path(data_dir: str, split: str) -> str:
  """``<data_dir>/wiki.<split>.tokens``; DataError when it is missing."""
  path = paths.join(data_dir, f"wiki.{split}.tokens")
  if not paths.isfile(path):
    raise errors.DataError(
        f"missing pretraining text {path}: mlm.data_dir needs "
        f"wiki.{{train,valid,test}}.tokens"
    )
  return path


def paragraphs(path: str) -> list[str]:
  """The non-empty, non-heading lines of a WikiText file, unescaped."""
  try:
    with paths.open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except UnicodeDecodeError as e:
    raise errors.DataError(f"{path} is not UTF-8 text ({e.reason})") from None
  out = []
  for line in lines:
    s = line.strip()
    if not s or s.startswith("= "):
      continue
    for a, b in _ESCAPES:
      s = s.replace(a, b)
    out.append(s)
  return out


def _vocabulary_what(vocab_size: int) -> str:
  return f"mlm sentencepiece v{_CACHE_VERSION} vocab_size={vocab_size}"


def vocabulary_file(
    data_dir: str, vocab_size: int, cache_dir: str, remember: bool = True
) -> str:
  """Where ``train_vocabulary`` keeps its model: named by the training
  file's SHA-256 (``content.key``), or as recorded in the cache when it is
  missing. It may not exist yet; ``remember=False`` writes nothing.

  Raises:
    errors.DataError: the training file is missing and nothing is recorded.
  """
  key = content.key(
      _vocabulary_what(vocab_size),
      lambda: [split_path(data_dir, "train")],
      cache_dir,
      paths.resolve(data_dir),
      remember,
  )
  return paths.join(cache_dir, f"spm_mlm_{vocab_size}_{key}.model")


def train_vocabulary(data_dir: str, vocab_size: int, cache_dir: str) -> str:
  """Trains (or finds cached) the sentencepiece model; returns its path.

  The translation vocabulary's trainer
  (``parallel.train_sentencepiece``), with ``[CLS]`` and ``[MASK]`` as
  user-defined pieces 3 and 4.
  """
  path = vocabulary_file(data_dir, vocab_size, cache_dir)
  if paths.isfile(path):
    return path
  train = split_path(data_dir, "train")
  paths.makedirs(cache_dir)
  parallel.train_sentencepiece(
      paragraphs(train),
      path,
      vocab_size,
      train,
      "mlm.vocab_size",
      user_symbols=(CLS, MASK),
  )
  content.record(
      cache_dir,
      _vocabulary_what(vocab_size),
      paths.resolve(data_dir),
      _key_of(path),
  )
  return path


def _key_of(path: str) -> str:
  """The ``content.key`` at the end of a cache file's name."""
  return paths.basename(path).rsplit(".", 1)[0].rsplit("_", 1)[-1]


load_vocabulary = parallel.load_vocabulary


def special_ids(vocab) -> tuple[int, int]:
  """(CLS id, MASK id) of a vocabulary trained by ``train_vocabulary``."""
  sp = vocab.tokenizer
  cls, mask = sp.piece_to_id(CLS), sp.piece_to_id(MASK)
  if UNK_ID in (cls, mask):
    raise errors.DataError(
        f"the sentencepiece model has no {CLS} / {MASK} piece: use one "
        "trained for masked LM (leave mlm.vocab_file empty)"
    )
  return int(cls), int(mask)


def encode(vocab, texts: list[str]) -> list[np.ndarray]:
  """Ids of each text (no EOS), int32."""
  return [np.asarray(x, np.int32) for x in vocab.tokenizer.encode(texts)]


def _split_what(split: str, vocab_path: str) -> str:
  vocab = content.file_sha256(vocab_path)[: content.KEY_LENGTH]
  return f"mlm ids v{_CACHE_VERSION} {split} vocabulary={vocab}"


def split_file(
    data_dir: str,
    split: str,
    vocab_path: str,
    cache_dir: str,
    remember: bool = True,
) -> str:
  """Where ``read_split`` keeps a split's ids: named by the SHA-256 of its
  text file and of the vocabulary, or as recorded in the cache when the
  text is missing. It may not exist yet; ``remember=False`` writes nothing.

  Raises:
    errors.DataError: the text file is missing and nothing is recorded.
  """
  key = content.key(
      _split_what(split, vocab_path),
      lambda: [split_path(data_dir, split)],
      cache_dir,
      paths.resolve(data_dir),
      remember,
  )
  return paths.join(cache_dir, f"mlm_{split}_{key}.npy")


def read_split(
    data_dir: str, split: str, vocab_path: str, cache_dir: str
) -> np.ndarray:
  """[N] int32 ids of a split's paragraphs, EOS after each (cached: a
  cached split needs no text file; a damaged cache is set aside and
  rebuilt, ``cache_files.read``)."""
  cache = split_file(data_dir, split, vocab_path, cache_dir)
  if paths.isfile(cache):
    ids = cache_files.read(
        cache, paths.np_load, lambda: split_path(data_dir, split)
    )
    if ids is not None:
      return ids
  path = split_path(data_dir, split)
  vocab = load_vocabulary(vocab_path)
  ids = encode(vocab, paragraphs(path))
  eos = np.array([EOS_ID], np.int32)
  stream = np.concatenate([np.concatenate([x, eos]) for x in ids])
  paths.makedirs(cache_dir)
  paths.np_save(cache, stream.astype(np.int32))
  content.record(
      cache_dir,
      _split_what(split, vocab_path),
      paths.resolve(data_dir),
      _key_of(cache),
  )
  return stream.astype(np.int32)


def mask_tokens(
    tokens: np.ndarray,
    rng: np.random.Generator,
    *,
    mask_id: int,
    first_ordinary: int,
    vocab_size: int,
    mask_prob: float = 0.15,
) -> dict[str, np.ndarray]:
  """BERT's corruption of a batch.

  Args:
    tokens: [B, T] int32 ids; 0 = padding, ids below ``first_ordinary``
      (pad, EOS, UNK, [CLS], [MASK]) are never chosen.
    rng: the random generator.
    mask_id: the [MASK] id.
    first_ordinary: the smallest id of an ordinary piece (random
      replacements are drawn from [first_ordinary, vocab_size)).
    vocab_size: V.
    mask_prob: the share of ordinary tokens chosen.

  Returns:
    'inputs' [B, T] corrupted ids, 'targets' [B, T] the original ids,
    'weights' [B, T] float32, 1 at the chosen positions, else 0.
  """
  tokens = np.asarray(tokens, np.int32)
  eligible = tokens >= first_ordinary
  chosen = eligible & (rng.random(tokens.shape) < mask_prob)
  action = rng.random(tokens.shape)
  inputs = tokens.copy()
  inputs[chosen & (action < 0.8)] = mask_id
  rand = chosen & (action >= 0.8) & (action < 0.9)
  inputs[rand] = rng.integers(first_ordinary, vocab_size, size=int(rand.sum()))
  return {
      "inputs": inputs,
      "targets": tokens,
      "weights": chosen.astype(np.float32),
  }


def windows(stream: np.ndarray, seq_len: int, cls_id: int) -> np.ndarray:
  """[N, seq_len] rows: [CLS] + consecutive non-overlapping windows of
  ``seq_len - 1`` stream tokens (a last partial window is left out)."""
  w = seq_len - 1
  n = len(stream) // w
  rows = np.asarray(stream[: n * w], np.int32).reshape(n, w)
  return np.concatenate([np.full((n, 1), cls_id, np.int32), rows], axis=1)


class MLMBatcher:
  """Random windows of the training stream, masked (see ``mask_tokens``).

  ``batch(step)`` is a pure function of (seed, step): the window starts and
  the masking draw come from ``np.random.default_rng([seed, step])``.
  """

  def __init__(
      self,
      stream: np.ndarray,
      *,
      seq_len: int,
      batch_size: int,
      seed: int,
      cls_id: int,
      mask_id: int,
      vocab_size: int,
      mask_prob: float,
  ):
    if len(stream) < seq_len:
      raise errors.DataError(
          f"the training stream has {len(stream)} tokens, fewer than "
          f"data.seq_len {seq_len}"
      )
    self.stream = stream
    self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
    self.cls_id, self.mask_id = cls_id, mask_id
    self.vocab_size, self.mask_prob = vocab_size, mask_prob

  def batch(self, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, step])
    w = self.seq_len - 1
    starts = rng.integers(0, len(self.stream) - w + 1, size=self.batch_size)
    rows = self.stream[starts[:, None] + np.arange(w)[None]]
    tokens = np.concatenate(
        [np.full((self.batch_size, 1), self.cls_id, np.int32), rows], axis=1
    )
    return mask_tokens(
        tokens,
        rng,
        mask_id=self.mask_id,
        first_ordinary=self.mask_id + 1,
        vocab_size=self.vocab_size,
        mask_prob=self.mask_prob,
    )
