"""A run's corpus: token streams through SeqIO, the vocabulary, the batcher.

Part of the experiment layer (``memjax.experiment`` re-exports every name
here): ``load_corpus`` reads the splits a run needs (evaluation never builds
the training batcher), ``make_batcher`` builds the training batcher of
``data.batching`` from its registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Optional

import jax
import ml_collections
import numpy as np

from memjax import errors
from memjax.io import paths
from memjax import registry
from memjax.data import sources

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


def data_dirs(
    config: ml_collections.ConfigDict, workdir: str
) -> tuple[str, str]:
  """(data_dir, cache_dir) of a run; nothing is created."""
  d = config.data
  data_dir = d.data_dir or sources.default_data_dir(d.corpus)
  return data_dir, d.cache_dir or paths.join(workdir, "cache")


@contextlib.contextmanager
def cleanup_on_error(workdir: str):
  """Removes ``workdir`` again if it is new and the block raises a UserError.

  Set-up reads and caches data in ``<workdir>/cache`` before it can know
  that, e.g., a corpus file is not UTF-8; a workdir that did not exist
  before is then removed, so bad input leaves nothing behind. An existing
  workdir is never touched.
  """
  existed = paths.exists(workdir)
  try:
    yield
  except errors.UserError:
    if not existed and paths.isdir(workdir) and jax.process_index() == 0:
      paths.rmtree(workdir, ignore_errors=True)
    raise


def eval_source(
    config: ml_collections.ConfigDict, corpus: str = "", data_dir: str = ""
) -> tuple[str, str, Optional[tuple[str, str]]]:
  """(corpus, data_dir, vocab_source) of a corpus read with a run's vocabulary.

  ``corpus`` (default ``eval.corpus``, else the run's own) is read with the
  vocabulary of the run's training corpus; vocab_source is None when it is
  the run's corpus itself.
  """
  own = config.data.data_dir or sources.default_data_dir(config.data.corpus)
  corpus = corpus or config.eval.get("corpus", "") or config.data.corpus
  if sources.canonical_corpus(corpus) == sources.canonical_corpus(
      config.data.corpus
  ) and not (data_dir or config.eval.get("data_dir", "")):
    return config.data.corpus, own, None
  data_dir = (
      data_dir
      or config.eval.get("data_dir", "")
      or sources.default_data_dir(corpus)
  )
  return corpus, data_dir, (config.data.corpus, own)


def check_data(
    config: ml_collections.ConfigDict, splits: tuple[str, ...], train: bool
) -> None:
  """Raises DataError if a needed split file is missing; writes nothing."""
  data_dir = config.data.data_dir or sources.default_data_dir(
      config.data.corpus
  )
  if train:
    sources.split_path(config.data.corpus, data_dir, "train")
  corpus, data_dir, _ = eval_source(config)
  for split in splits:
    sources.split_path(corpus, data_dir, split)


def read_stream(
    config: ml_collections.ConfigDict,
    workdir: str,
    split: str,
    corpus: str = "",
    data_dir: str = "",
) -> Any:
  """One split of ``corpus`` (default ``eval.corpus``, else the run's) as a
  ``tasks.TokenStream`` in the run's vocabulary."""
  from memjax.data import tasks  # pylint: disable=g-import-not-at-top

  corpus, data_dir, vocab_source = eval_source(config, corpus, data_dir)
  sources.split_path(corpus, data_dir, split)
  cache_dir = data_dirs(config, workdir)[1]
  paths.makedirs(cache_dir)
  return tasks.load_token_stream(
      corpus, data_dir, split, cache_dir, vocab_source
  )


def load_corpus(
    config: ml_collections.ConfigDict,
    workdir: str,
    splits: Optional[tuple[str, ...]] = None,
    train: bool = True,
) -> Corpus:
  """Reads the corpus through its SeqIO task (token streams are cached).

  Args:
    config: the run's config.
    workdir: the run's directory (default cache ``<workdir>/cache``).
    splits: evaluation splits to read (default ``eval.splits``).
    train: also read the training split (training, unigram baselines).
  """
  from memjax.data import tasks  # pylint: disable=g-import-not-at-top
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  splits = tuple(config.eval.splits if splits is None else splits)
  check_data(config, splits, train)
  data_dir, cache_dir = data_dirs(config, workdir)
  paths.makedirs(cache_dir)
  corpus = config.data.corpus
  train_stream = (
      tasks.load_token_stream(corpus, data_dir, "train", cache_dir)
      if train
      else None
  )
  streams_ = {s: read_stream(config, workdir, s) for s in splits}
  vocab = vocab_lib.get_vocabulary(corpus, data_dir, cache_dir)
  return Corpus(
      sources.canonical_corpus(corpus),
      int(vocab.vocab_size),
      metric_unit(corpus),
      train_stream,
      streams_,
      cache_dir,
  )


def vocabulary(config: ml_collections.ConfigDict, workdir: str) -> Any:
  """The corpus vocabulary of a run's config (built or read from the cache)."""
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  data_dir, cache_dir = data_dirs(config, workdir)
  return vocab_lib.get_vocabulary(config.data.corpus, data_dir, cache_dir)


def make_batcher(
    config: ml_collections.ConfigDict, train: Any, cache_dir: str
) -> Any:
  """The training batcher of ``data.batching`` (a pure function of the step).

  The batcher registered under that name in ``registry.BATCHERS`` is built
  from the config, the training ``tasks.TokenStream`` and the cache
  directory.
  """
  from memjax import validation  # pylint: disable=g-import-not-at-top

  validation.run_config_checks(config)
  make = registry.BATCHERS.get(config.data.batching)
  return make(config, train, cache_dir)


# The batch arrays every train step may consume; a batcher adds the ones its
# model family takes besides (``batcher.model_inputs``, e.g. a translation
# batch's 'source').
STEP_KEYS = ("inputs", "targets", "weights", "reset", "lane_id")


def host_batch(batcher: Any, step: int) -> dict[str, np.ndarray]:
  """The global batch of a step with only the arrays the step consumes."""
  b = batcher.batch(step)
  keep = STEP_KEYS + tuple(getattr(batcher, "model_inputs", ()))
  return {k: np.asarray(v) for k, v in b.items() if k in keep}
