"""SeqIO tasks for the language-modelling corpora, and cached token streams.

A task yields one example per document ({'text': str or bytes}) of a split,
in file order, tokenised by the corpus vocabulary into 'targets' (no EOS is
appended: WikiText's EOS ids come from the line breaks, the byte corpora
have none). :func:`load_token_stream` concatenates the documents of a split
into one id stream, the input of the batchers in ``memjax.data.streams``,
and caches it as an .npz file.

SeqIO and TensorFlow load only when a stream is tokenised (the ``[data]``
extra): reading a cached stream needs neither.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Optional, TYPE_CHECKING

import numpy as np

from memjax.io import optional
from memjax.io import paths
from memjax.data import cache_files
from memjax.data import content
from memjax.data import sources
from memjax.data import vocab as vocab_lib

if TYPE_CHECKING:
  import seqio  # pylint: disable=g-bad-import-order

# seqio split name -> corpus split name.
SEQIO_SPLITS: dict[str, str] = {
    "train": "train",
    "validation": "valid",
    "test": "test",
}

# Bump when the layout of cached token streams changes.
_STREAM_CACHE_VERSION = 1


# Where a stream's vocabulary comes from: (corpus, data_dir) of its training
# split. None: the corpus's own.
VocabSource = Optional[tuple[str, str]]


def task_name(
    corpus: str, data_dir: str, vocab_source: VocabSource = None
) -> str:
  """Name of the task of ``corpus`` in ``data_dir``: memjax_<corpus>_<hash>.

  The hash is the first 8 hex digits of the SHA-1 of the absolute data_dir
  (and of the vocabulary's source when it is another corpus).
  """
  corpus = sources.canonical_corpus(corpus)
  data_dir = paths.resolve(data_dir)
  key = data_dir
  if vocab_source is not None:
    key += "|" + "|".join(_vocab_source(corpus, data_dir, vocab_source))
  digest = hashlib.sha1(key.encode()).hexdigest()[:8]
  return f"memjax_{corpus}_{digest}"


def _vocab_source(
    corpus: str, data_dir: str, vocab_source: VocabSource
) -> tuple[str, str]:
  """The (canonical corpus, absolute data_dir) the vocabulary is built from.

  Raises:
    sources.DataError: a vocabulary of another level (words vs bytes).
  """
  if vocab_source is None:
    vocab_source = (corpus, data_dir)
  v_corpus, v_dir = vocab_source
  v_spec, spec = sources.corpus_spec(v_corpus), sources.corpus_spec(corpus)
  if v_spec.level != spec.level:
    raise sources.DataError(
        f"corpus {spec.name} is {spec.level}-level but the run's vocabulary "
        f"({v_spec.name}) is {v_spec.level}-level: evaluate on a "
        f"{v_spec.level}-level corpus"
    )
  return v_spec.name, paths.resolve(v_dir)


def _documents_dataset(
    split: str,
    shuffle_files: bool,
    seed: int | None = None,
    *,
    corpus: str,
    data_dir: str,
) -> Any:
  """tf.data.Dataset of {'text': scalar tf.string}, one per document."""
  del shuffle_files, seed  # Order is kept; the batchers do the shuffling.
  tf = optional.tensorflow("a SeqIO task")
  docs = sources.read_documents(corpus, data_dir, SEQIO_SPLITS[split])
  return tf.data.Dataset.from_generator(
      lambda: ({"text": d} for d in docs),
      output_signature={"text": tf.TensorSpec([], tf.string)},
  )


def register_lm_task(
    corpus: str,
    data_dir: str,
    cache_dir: str | None = None,
    vocab_source: VocabSource = None,
) -> seqio.Task:
  """Registers (once) and returns the seqio.Task of ``corpus`` in data_dir.

  Args:
      corpus: 'wikitext103' (or an alias), 'enwik8' or 'text8'.
      data_dir: directory with the corpus files.
      cache_dir: where the word vocabulary is cached (see
          ``vocab.get_vocabulary``).
      vocab_source: (corpus, data_dir) whose training split gives the
          vocabulary (default: this corpus's), e.g. a model's corpus when
          another corpus is read with its vocabulary (domain adaptation).

  Returns:
      The task named :func:`task_name`, with splits train / validation /
      test, features {'targets': int32 [num_tokens]}, one example per
      document. Registering again returns the registered task.

  Raises:
      sources.DataError: unknown corpus, missing directory or train file.
  """
  seqio = optional.require("seqio", f"tokenising {corpus}")
  from memjax.data import seqio_vocab  # pylint: disable=g-import-not-at-top

  corpus = sources.canonical_corpus(corpus)
  data_dir = paths.resolve(data_dir)
  name = task_name(corpus, data_dir, vocab_source)
  if name in seqio.TaskRegistry.names():
    return seqio.TaskRegistry.get(name)
  sources.split_path(corpus, data_dir, "train")  # Fail early, clearly.
  vocabulary = vocab_lib.get_vocabulary(
      *_vocab_source(corpus, data_dir, vocab_source), cache_dir
  )
  source = seqio.FunctionDataSource(
      dataset_fn=functools.partial(
          _documents_dataset, corpus=corpus, data_dir=data_dir
      ),
      splits=tuple(SEQIO_SPLITS),
  )
  return seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=[
          functools.partial(
              seqio.preprocessors.rekey, key_map={"targets": "text"}
          ),
          functools.partial(
              seqio.preprocessors.tokenize,
              copy_pretokenized=False,
              with_eos=False,
          ),
      ],
      output_features={
          "targets": seqio.Feature(
              seqio_vocab.to_seqio(vocabulary),
              add_eos=False,
              dtype=seqio_vocab.tf.int32,
          ),
      },
      metric_fns=[],
  )


@dataclasses.dataclass
class TokenStream:
  """A split as one stream of token ids.

  Attributes:
      tokens: [N] int32 ids, documents concatenated in file order.
      doc_starts: [D] int64 offset of each document's first token.
      vocab_size: size of the vocabulary the ids come from.
  """

  tokens: np.ndarray
  doc_starts: np.ndarray
  vocab_size: int

  @property
  def num_predictions(self) -> int:
    """Number of next-token predictions in the stream: N - 1."""
    return max(len(self.tokens) - 1, 0)


def _stream_what(
    corpus: str, split: str, vocabulary: str, vocab_size: int
) -> str:
  """The ``content.key`` description of a token stream."""
  return (
      f"token stream v{_STREAM_CACHE_VERSION} {corpus} {split} "
      f"vocabulary={vocabulary} V={vocab_size}"
  )


def _stream_path(
    corpus: str,
    data_dir: str,
    split: str,
    vocab_size: int,
    directory: str,
    vocab_source: VocabSource = None,
    remember: bool = True,
) -> tuple[str, str, str]:
  """(cache file, content.key description, where) of a token stream.

  The key covers the split file's bytes and the vocabulary's own key (its
  training file's bytes), so a stream is never read with another
  vocabulary, even where some of the files are missing.
  """
  v_corpus, v_dir = _vocab_source(corpus, data_dir, vocab_source)
  vocabulary = "bytes"
  if sources.corpus_spec(v_corpus).level == "word":
    vocabulary = vocab_lib.word_vocabulary_key(
        v_corpus, v_dir, directory, remember=remember
    )
  where = paths.resolve(data_dir)
  what = _stream_what(corpus, split, f"{v_corpus}.{vocabulary}", vocab_size)
  key = content.key(
      what,
      lambda: [sources.split_path(corpus, data_dir, split)],
      directory,
      where,
      remember,
  )
  name = f"{corpus}.{split}.v{vocab_size}.{key}.npz"
  return paths.join(directory, name), what, where


def token_stream_path(
    corpus: str,
    data_dir: str,
    split: str,
    cache_dir: str | None = None,
    vocab_source: VocabSource = None,
) -> str:
  """Cache file of the token stream of ``split``.

  Its name holds the corpus, split, vocabulary size and a hash of the bytes
  of the split's file and of the vocabulary's key (its training file's
  bytes; ``content.key``): a copy of the corpus elsewhere finds it, and with the
  corpus files missing the cache's record names it.
  """
  corpus = sources.canonical_corpus(corpus)
  split = sources.canonical_split(split)
  vocabulary = vocab_lib.get_vocabulary(
      *_vocab_source(corpus, data_dir, vocab_source), cache_dir
  )
  directory = sources.resolve_cache_dir(cache_dir, data_dir)
  return _stream_path(
      corpus, data_dir, split, vocabulary.vocab_size, directory, vocab_source
  )[0]


def is_cached(
    corpus: str,
    data_dir: str,
    split: str,
    cache_dir: str,
    vocab_source: VocabSource = None,
) -> bool:
  """Whether ``cache_dir`` holds the token stream of ``split`` and its
  vocabulary, so that a run reads it without the corpus files; writes
  nothing (no sidecar, no vocabulary)."""
  if not cache_dir or not paths.isdir(paths.resolve(cache_dir)):
    return False
  corpus = sources.canonical_corpus(corpus)
  split = sources.canonical_split(split)
  v_corpus, v_dir = _vocab_source(corpus, data_dir, vocab_source)
  try:
    if sources.corpus_spec(v_corpus).level == "byte":
      vocab_size = vocab_lib.byte_vocabulary().vocab_size
    else:
      vocab_path = vocab_lib.word_vocabulary_path(
          v_corpus, v_dir, cache_dir, remember=False
      )
      if not paths.isfile(vocab_path):
        return False
      vocab_size = vocab_lib.get_vocabulary(
          v_corpus, v_dir, cache_dir, remember=False
      ).vocab_size
    path = _stream_path(
        corpus,
        data_dir,
        split,
        vocab_size,
        paths.resolve(cache_dir),
        vocab_source,
        remember=False,
    )[0]
  except content.AmbiguousCacheError:
    raise
  except sources.DataError:
    return False
  return paths.isfile(path)


def _require_tokenizer(corpus: str) -> None:
  """Raises MissingDependencyError when SeqIO or TensorFlow is missing:
  checked before anything is written into the cache."""
  optional.require("seqio", f"tokenising {corpus}")


def read_cached_stream(path: str) -> TokenStream:
  """A cached stream's .npz, read whole (``cache_files.READ_ERRORS`` when
  it is damaged)."""
  with paths.np_load(path) as f:
    return TokenStream(
        tokens=np.asarray(f["tokens"]),
        doc_starts=np.asarray(f["doc_starts"]),
        vocab_size=int(f["vocab_size"]),
    )


def load_token_stream(
    corpus: str,
    data_dir: str,
    split: str,
    cache_dir: str | None = None,
    vocab_source: VocabSource = None,
) -> TokenStream:
  """Returns ``split`` of ``corpus`` as a :class:`TokenStream`.

  The first call runs the seqio task over the split and writes an .npz
  cache file (see :func:`token_stream_path`); later calls read that file.
  A damaged cache file is set aside and rebuilt when the corpus is there
  (``cache_files.read``).

  Args:
      corpus: 'wikitext103' (or an alias), 'enwik8' or 'text8'.
      data_dir: directory with the corpus files.
      split: 'train', 'valid' (or 'validation') or 'test'.
      cache_dir: cache directory (see ``sources.resolve_cache_dir``).
      vocab_source: as in :func:`register_lm_task`.

  Raises:
      sources.DataError: unknown corpus or split, missing directory or file,
          a vocabulary of another level, a damaged cache file without its
          corpus.
  """
  corpus = sources.canonical_corpus(corpus)
  split = sources.canonical_split(split)
  directory = sources.resolve_cache_dir(cache_dir, data_dir)
  if not is_cached(corpus, data_dir, split, directory, vocab_source):
    # Checked before anything is written into the cache.
    sources.split_path(corpus, data_dir, split)  # Missing: one clear line.
    _require_tokenizer(corpus)
  vocabulary = vocab_lib.get_vocabulary(
      *_vocab_source(corpus, data_dir, vocab_source), directory
  )
  path, what, where = _stream_path(
      corpus, data_dir, split, vocabulary.vocab_size, directory, vocab_source
  )
  if paths.isfile(path):
    stream = cache_files.read(
        path,
        read_cached_stream,
        lambda: sources.split_path(corpus, data_dir, split),
    )
    if stream is not None:
      return stream
    _require_tokenizer(corpus)
  seqio_split = {v: k for k, v in SEQIO_SPLITS.items()}[split]
  print(
      f"memjax.data: tokenizing {corpus} {split} of {data_dir} into {path}",
      flush=True,
  )
  task = register_lm_task(corpus, data_dir, cache_dir, vocab_source)
  ds = task.get_dataset(
      sequence_length=None,
      split=seqio_split,
      shuffle=False,
      use_cached=False,
  )
  docs = [ex["targets"] for ex in ds.as_numpy_iterator()]
  lengths = np.array([len(d) for d in docs], dtype=np.int64)
  stream = TokenStream(
      tokens=np.concatenate([np.zeros([0], np.int32)] + docs).astype(np.int32),
      doc_starts=(np.cumsum(lengths) - lengths).astype(np.int64),
      vocab_size=task.output_features["targets"].vocabulary.vocab_size,
  )
  paths.np_savez(
      path,
      tokens=stream.tokens,
      doc_starts=stream.doc_starts,
      vocab_size=np.int64(stream.vocab_size),
  )
  content.record(directory, what, where, path.rsplit(".", 2)[-2])
  return stream
