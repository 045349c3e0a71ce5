"""Raw-text corpora read through a pretrained model's own tokenizer.

The 'text'-level corpora of ``memjax.data.sources`` (``wikitext103_raw``:
WikiText-103's ``wiki.{train,valid,test}.raw``; ``text``: any
``{train,valid,test}.txt``) have no vocabulary of their own: a split is
cut into documents (WikiText's articles, or the whole file) and each
document is encoded by the imported ``tokenizer.json``
(``memjax.data.tokenizer_vocab.TokenizerVocabulary``, the ``tokenizers``
package; no TensorFlow or SeqIO) as its post-processor encodes a text
(Hugging Face's ``tok(document)``: a Llama's BOS first, an EOS last where
the tokenizer adds one), the ids concatenated in file order.

The stream is cached as the other corpora's are
(``<corpus>.<split>.v<V>.<key>.npz``): its key (``memjax.data.content``)
covers the split file's bytes and the tokenizer.json's, so a stream is
never read with another tokenizer, and a copy of the corpus elsewhere
finds it.

Which tokenizer: the run's own vocabulary when it is a tokenizer (an
imported model's workdir, or a run trained from one), else the workdir
``data.tokenizer`` names (``tokenizer_dir``).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Optional

import numpy as np

from memjax import errors
from memjax.data import cache_files
from memjax.data import content
from memjax.data import sources
from memjax.data import tokenizer_vocab
from memjax.io import paths

# A run's vocabulary entry (``memjax.checkpoints.VOCAB_FILE``).
VOCAB_FILE = "vocab.json"

# Bump when the layout of cached text streams changes (2: documents with
# the special tokens the tokenizer adds).
_CACHE_VERSION = 2


def has_tokenizer(directory: str) -> bool:
  """Whether ``directory``'s vocab.json is a tokenizer.json's."""
  path = paths.join(directory, VOCAB_FILE)
  if not directory or not paths.isfile(path):
    return False
  try:
    return paths.read_json(path).get("kind") == "tokenizer"
  except (OSError, ValueError):
    return False


def tokenizer_dir(d: Any, workdir: str) -> str:
  """The directory whose tokenizer a run reads text with, or ''.

  Args:
    d: the run's data settings (``data.tokenizer``).
    workdir: the run's directory: its own tokenizer comes first.

  Raises:
    errors.ConfigError: ``data.tokenizer`` names a directory without an
      imported model's vocabulary.
  """
  if has_tokenizer(workdir):
    return paths.resolve(workdir)
  if not d.tokenizer:
    return ""
  if not has_tokenizer(d.tokenizer):
    raise errors.ConfigError(
        f"data.tokenizer={d.tokenizer} holds no imported tokenizer (a "
        "vocab.json of kind 'tokenizer' beside its tokenizer.json): name "
        "the workdir of --mode=import"
    )
  return paths.resolve(d.tokenizer)


def no_tokenizer(corpus: str) -> errors.ConfigError:
  """The error of a raw-text corpus read with no tokenizer."""
  return errors.ConfigError(
      f"corpus {corpus} is raw text, read through a pretrained model's "
      "tokenizer: run it in an imported model's workdir, or name one with "
      "--config.data.tokenizer=DIR (docs/pretrained.md)"
  )


def vocabulary(directory: str, corpus: str = "text") -> Any:
  """The ``TokenizerVocabulary`` saved in ``directory``.

  Raises:
    errors.ConfigError: no directory (``no_tokenizer``).
  """
  if not directory:
    raise no_tokenizer(corpus)
  info = paths.read_json(paths.join(directory, VOCAB_FILE))
  path = paths.join(directory, info["file"])
  return tokenizer_vocab.TokenizerVocabulary.load(path, info)


@functools.lru_cache(maxsize=16)
def _added_bos(directory: str, stamp: str) -> Optional[int]:
  """``added_bos`` of the tokenizer in ``directory`` (kept per ``stamp``:
  its vocab.json and the tokenizer.json's sizes)."""
  del stamp
  return vocabulary(directory).added_bos


def window_bos(directory: str) -> Optional[int]:
  """The BOS id evaluation windows begin with: the one the tokenizer of
  ``directory`` (``tokenizer_dir``) puts before a text, or None (no
  tokenizer, or one that adds no BOS)."""
  if not directory:
    return None
  stamp = []
  for name in (VOCAB_FILE, tokenizer_vocab.FILE):
    path = paths.join(directory, name)
    stamp.append(str(paths.getsize(path)))
  return _added_bos(paths.resolve(directory), ",".join(stamp))


def _tokenizer_key(directory: str) -> str:
  """The SHA-256 of the tokenizer.json and its vocab.json entry."""
  h = hashlib.sha256()
  for name in (VOCAB_FILE, tokenizer_vocab.FILE):
    h.update(paths.read_bytes(paths.join(directory, name)))
  return h.hexdigest()[: content.KEY_LENGTH]


def stream_path(
    corpus: str,
    data_dir: str,
    split: str,
    cache_dir: str,
    tokenizer: str,
    remember: bool = True,
) -> tuple[str, str, str]:
  """(cache file, ``content.key`` description, where) of a split's stream
  through the tokenizer of the directory ``tokenizer``."""
  spec = sources.corpus_spec(corpus)
  info = paths.read_json(paths.join(tokenizer, VOCAB_FILE))
  size = int(info["size"])
  what = (
      f"text stream v{_CACHE_VERSION} {spec.name} {split} "
      f"tokenizer={_tokenizer_key(tokenizer)} V={size}"
  )
  where = paths.resolve(data_dir)
  key = content.key(
      what,
      lambda: [sources.split_path(spec.name, data_dir, split)],
      cache_dir,
      where,
      remember,
  )
  name = f"{spec.name}.{split}.v{size}.{key}.npz"
  return paths.join(cache_dir, name), what, where


def is_cached(
    corpus: str, data_dir: str, split: str, cache_dir: str, tokenizer: str
) -> bool:
  """Whether ``cache_dir`` holds the split's stream; writes nothing."""
  if not tokenizer or not cache_dir or not paths.isdir(cache_dir):
    return False
  try:
    path = stream_path(corpus, data_dir, split, cache_dir, tokenizer, False)
  except content.AmbiguousCacheError:
    raise
  except errors.DataError:
    return False
  return paths.isfile(path[0])


def encode_documents(vocab: Any, docs: list[str]) -> tuple[np.ndarray, ...]:
  """(tokens [N] int32, doc_starts [D] int64) of the documents encoded one
  by one (each with the special tokens the tokenizer adds) and
  concatenated."""
  ids = [np.asarray(vocab.encode(doc), np.int32) for doc in docs]
  lengths = np.array([len(x) for x in ids], np.int64)
  tokens = np.concatenate([np.zeros([0], np.int32)] + ids)
  return tokens, (np.cumsum(lengths) - lengths).astype(np.int64)


def load_stream(
    corpus: str, data_dir: str, split: str, cache_dir: str, tokenizer: str
) -> Any:
  """A split of a 'text'-level corpus as a ``tasks.TokenStream`` of the
  tokenizer's ids (read from the cache, else encoded and cached; a damaged
  cache file is set aside and rebuilt, ``cache_files.read``).

  Args:
    corpus: 'wikitext103_raw' or 'text' (or an alias).
    data_dir: the corpus files.
    split: 'train', 'valid' (or 'validation') or 'test'.
    cache_dir: the run's cache directory.
    tokenizer: the directory holding the tokenizer (``tokenizer_dir``).

  Raises:
    errors.ConfigError: no tokenizer to read the text with.
    errors.DataError: a missing directory or file, text that is not UTF-8,
      a damaged cache file without its corpus.
  """
  from memjax.data import tasks  # pylint: disable=g-import-not-at-top

  spec = sources.corpus_spec(corpus)
  split = sources.canonical_split(split)
  if not tokenizer:
    raise no_tokenizer(spec.name)
  paths.makedirs(cache_dir)
  path, what, where = stream_path(
      spec.name, data_dir, split, cache_dir, tokenizer
  )
  size = int(path.rsplit(".v", 1)[1].split(".")[0])
  if paths.isfile(path):
    stream = cache_files.read(
        path,
        tasks.read_cached_stream,
        lambda: sources.split_path(spec.name, data_dir, split),
    )
    if stream is not None:
      return stream
  print(
      f"memjax.data: tokenizing {spec.name} {split} of {data_dir} with "
      f"{tokenizer}/tokenizer.json into {path}",
      flush=True,
  )
  docs = sources.read_documents(spec.name, data_dir, split)
  tokens, starts = encode_documents(vocabulary(tokenizer), docs)
  paths.np_savez(
      path, tokens=tokens, doc_starts=starts, vocab_size=np.int64(size)
  )
  content.record(cache_dir, what, where, path.rsplit(".", 2)[-2])
  return tasks.TokenStream(tokens=tokens, doc_starts=starts, vocab_size=size)


def is_text(corpus: str) -> bool:
  """Whether ``corpus`` is read through a pretrained tokenizer."""
  return sources.corpus_spec(corpus).level == "text"
