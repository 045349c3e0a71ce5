"""A run's corpus: token streams (SeqIO, or an imported tokenizer's for raw
text: ``memjax.data.text_streams``) and the vocabulary.

``load_corpus`` reads the splits a run needs (evaluation never builds the
training batcher); ``host_batch`` takes from a batcher's batch the arrays a
step consumes. The corpus is named by the ``data`` settings, the splits
scored by the ``eval`` settings (``memjax.settings``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Optional

import jax
import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.data import sources
from memjax.data import text_streams
from memjax.io import lease
from memjax.io import paths

# ``data.corpus`` of translation runs: parallel text read by
# ``memjax.data.parallel`` (not a language-modelling corpus of ``sources``).
PARALLEL_CORPUS = "parallel"


def metric_unit(corpus: str) -> str:
  """'bpc' for byte corpora (enwik8, text8), 'ppl' for word corpora, 'bleu'
  for parallel text."""
  if corpus == PARALLEL_CORPUS:
    return "bleu"
  return "bpc" if sources.corpus_spec(corpus).level == "byte" else "ppl"


@dataclasses.dataclass
class Corpus:
  """The token streams of one corpus.

  Attributes:
    name: canonical corpus name.
    vocab_size: V.
    unit: 'ppl' (words) or 'bpc' (bytes).
    train: the training ``tasks.TokenStream`` (None when not read).
    splits: evaluation streams by split name.
    cache_dir: where vocabularies, token streams and packings are cached.
  """

  name: str
  vocab_size: int
  unit: str
  train: Any
  splits: dict[str, Any]
  cache_dir: str


Data = settings_lib.Data
Eval = settings_lib.Eval


def data_dirs(d: Data, workdir: str) -> tuple[str, str]:
  """(data_dir, cache_dir) of a run; nothing is created."""
  data_dir = d.data_dir or sources.default_data_dir(d.corpus)
  return data_dir, d.cache_dir or paths.join(workdir, "cache")


@contextlib.contextmanager
def cleanup_on_error(workdir: str):
  """Removes ``workdir`` again if it is new and the block raises a UserError.

  Set-up reads and caches data in ``<workdir>/cache`` before it can know
  that, e.g., a corpus file is not UTF-8; a workdir that did not exist
  before is then removed, so bad input leaves nothing behind (one that
  the run's lease created counts as new: ``memjax.io.lease.created``). An
  existing workdir is never touched.
  """
  # A workdir that only this job's lease created counts as new.
  existed = paths.exists(workdir) and not lease.created(workdir)
  try:
    yield
  except errors.UserError:
    if not existed and paths.isdir(workdir) and jax.process_index() == 0:
      paths.rmtree(workdir, ignore_errors=True)
    raise


def eval_source(
    d: Data, e: Eval, corpus: str = "", data_dir: str = ""
) -> tuple[str, str, Optional[tuple[str, str]]]:
  """(corpus, data_dir, vocab_source) of a corpus read with a run's vocabulary.

  ``corpus`` (default ``eval.corpus``, else the run's own) is read with the
  vocabulary of the run's training corpus; vocab_source is None when it is
  the run's corpus itself.
  """
  own = d.data_dir or sources.default_data_dir(d.corpus)
  corpus = corpus or e.corpus or d.corpus
  if sources.canonical_corpus(corpus) == sources.canonical_corpus(
      d.corpus
  ) and not (data_dir or e.data_dir):
    return d.corpus, own, None
  data_dir = data_dir or e.data_dir or sources.default_data_dir(corpus)
  return corpus, data_dir, (d.corpus, own)


def check_data(
    d: Data, e: Eval, splits: tuple[str, ...], train: bool, workdir: str = ""
) -> None:
  """Raises DataError if a needed split file is missing and the run's cache
  (``data.cache_dir``, else ``<workdir>/cache``) does not hold its tokens;
  writes nothing."""
  from memjax.data import tasks  # pylint: disable=g-import-not-at-top

  cache_dir = data_dirs(d, workdir)[1] if (workdir or d.cache_dir) else ""

  tokenizer = _check_vocabulary(d, e, workdir)

  def check(corpus, data_dir, split, vocab_source):
    try:
      sources.split_path(corpus, data_dir, split)
    except errors.DataError:
      if tokenizer:
        if not text_streams.is_cached(
            corpus, data_dir, split, cache_dir, tokenizer
        ):
          raise
      elif not tasks.is_cached(
          corpus, data_dir, split, cache_dir, vocab_source
      ):
        raise

  if train:
    check(
        d.corpus,
        d.data_dir or sources.default_data_dir(d.corpus),
        "train",
        None,
    )
  corpus, data_dir, vocab_source = eval_source(d, e)
  for split in splits:
    check(corpus, data_dir, split, vocab_source)


def read_stream(
    d: Data,
    e: Eval,
    workdir: str,
    split: str,
    corpus: str = "",
    data_dir: str = "",
) -> Any:
  """One split of ``corpus`` (default ``eval.corpus``, else the run's) as a
  ``tasks.TokenStream`` in the run's vocabulary."""
  from memjax.data import tasks  # pylint: disable=g-import-not-at-top

  corpus, data_dir, vocab_source = eval_source(d, e, corpus, data_dir)
  cache_dir = data_dirs(d, workdir)[1]
  paths.makedirs(cache_dir)
  if text_streams.is_text(corpus):
    tokenizer = text_streams.tokenizer_dir(d, workdir)
    return text_streams.load_stream(
        corpus, data_dir, split, cache_dir, tokenizer
    )
  return tasks.load_token_stream(
      corpus, data_dir, split, cache_dir, vocab_source
  )


def _check_vocabulary(d: Data, e: Eval, workdir: str) -> str:
  """The directory of the tokenizer the run reads text with ('' = none),
  checked against the corpora it reads.

  Raises:
    errors.ConfigError: a corpus in its own vocabulary read by a model
      with an imported tokenizer (the numbers would be meaningless), or
      a raw-text corpus with no tokenizer to read it with.
  """
  tokenizer = text_streams.tokenizer_dir(d, workdir)
  for name in {d.corpus, e.corpus or d.corpus}:
    if bool(tokenizer) != text_streams.is_text(name):
      if tokenizer:
        raise errors.ConfigError(
            f"{workdir} holds an imported model, which reads text through "
            f"its own tokenizer, but corpus {name} has a vocabulary of its "
            "own: use data.corpus=wikitext103_raw or data.corpus=text "
            "(docs/pretrained.md)"
        )
      raise text_streams.no_tokenizer(name)
  return tokenizer


def load_corpus(
    d: Data,
    e: Eval,
    workdir: str,
    splits: Optional[tuple[str, ...]] = None,
    train: bool = True,
) -> Corpus:
  """Reads the corpus through its SeqIO task, or a raw-text corpus through
  the run's imported tokenizer (token streams are cached either way).

  Args:
    d: the run's data settings.
    e: its evaluation settings (the corpus and splits scored).
    workdir: the run's directory (default cache ``<workdir>/cache``).
    splits: evaluation splits to read (default ``eval.splits``).
    train: also read the training split (training, unigram baselines).

  Raises:
    errors.ConfigError: a model with an imported tokenizer given a corpus
      in its own vocabulary, or a raw-text corpus without a tokenizer.
  """
  splits = tuple(e.splits if splits is None else splits)
  check_data(d, e, splits, train, workdir)
  cache_dir = data_dirs(d, workdir)[1]
  paths.makedirs(cache_dir)
  corpus = d.corpus
  train_stream = None
  if train:
    train_stream = read_stream(d, settings_lib.Eval(), workdir, "train")
  streams_ = {s: read_stream(d, e, workdir, s) for s in splits}
  vocab = vocabulary(d, workdir)
  return Corpus(
      sources.canonical_corpus(corpus),
      int(vocab.vocab_size),
      metric_unit(corpus),
      train_stream,
      streams_,
      cache_dir,
  )


def vocabulary(d: Data, workdir: str) -> Any:
  """The corpus vocabulary of a run (built or read from the cache), or the
  imported tokenizer a raw-text corpus is read through."""
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  if text_streams.is_text(d.corpus):
    tokenizer = text_streams.tokenizer_dir(d, workdir)
    return text_streams.vocabulary(tokenizer, d.corpus)

  data_dir, cache_dir = data_dirs(d, workdir)
  return vocab_lib.get_vocabulary(d.corpus, data_dir, cache_dir)


# The batch arrays every train step may consume; a model family takes
# others besides (``extend.Family.extra_inputs``, e.g. a translation
# batch's 'source').
STEP_KEYS = ("inputs", "targets", "weights", "reset", "lane_id")


def host_batch(
    batcher: Any, step: int, extra_inputs: tuple[str, ...] = ()
) -> dict[str, np.ndarray]:
  """The global batch of a step with only the arrays the step consumes."""
  b = batcher.batch(step)
  keep = STEP_KEYS + tuple(extra_inputs)
  return {k: np.asarray(v) for k, v in b.items() if k in keep}
