"""The parts of a translation run: config checks, the run's vocabulary, the
encoded splits, the translator and split scoring.

``memjax.tasks.translation.task`` (training and evaluation through the common
loop) and the ``translate`` mode use them. Everything the user can get wrong
(data files, a vocabulary of another run) is checked before anything is
written.
"""

from __future__ import annotations

import time
from typing import Any

from memjax import errors
from memjax import settings as settings_lib
from memjax.checkpoints import runfiles
from memjax.io import optional
from memjax.io import paths
from memjax.data import content
from memjax.data import parallel
from memjax.tasks import config as task_config
from memjax.tasks.translation import bleu
from memjax.tasks.translation import translator as translator_lib

Settings = settings_lib.Settings


def data_dir(d: settings_lib.Data) -> str:
  return d.data_dir or parallel.DEFAULT_DIR


def check_settings(s: Settings) -> None:
  """Raises ConfigError for settings a translation run cannot use."""
  if s.model.family != "encoder_decoder":
    raise errors.ConfigError(
        "a translation run needs model.family='encoder_decoder', got "
        f"{s.model.family!r}"
    )
  t = s.of(task_config.Translation)
  if t.source_lang == t.target_lang:
    raise errors.ConfigError(
        "translation.source_lang and target_lang must differ, both are "
        f"{t.source_lang!r}"
    )
  if t.beam_size < 1 or t.decode_batch_size < 1:
    raise errors.ConfigError(
        "translation.beam_size and decode_batch_size must be >= 1"
    )
  if max(t.buckets) > s.model.max_len:
    raise errors.ConfigError(
        f"translation.buckets {tuple(t.buckets)} exceed model.max_len "
        f"{s.model.max_len}"
    )


def check_vocabulary(vocab_path: str, workdir: str) -> None:
  """Raises CheckpointMismatchError if ``workdir`` holds a run trained with
  another vocabulary than ``vocab_path``."""
  saved = paths.join(workdir, runfiles.VOCAB_FILE)
  if not paths.isfile(saved):
    return
  info = paths.read_json(saved)
  sha = runfiles.file_sha1(vocab_path)
  if info.get("kind") != "sentencepiece" or info.get("sha1") != sha:
    raise errors.CheckpointMismatchError(
        f"{vocab_path} is not the vocabulary the run in {workdir} was trained "
        f"with (sha1 {sha[:12]} vs {str(info.get('sha1'))[:12]}): use the "
        "run's spm.model or another --workdir"
    )


def vocabulary_path(s: Settings, workdir: str) -> str:
  """The sentencepiece model of a run: ``translation.vocab_file``, the one a
  run in ``workdir`` saved, or one trained on the training split."""
  t = s.of(task_config.Translation)
  if t.vocab_file:
    path = paths.local_file(paths.resolve(t.vocab_file))
    parallel.load_vocabulary(path)
    check_vocabulary(path, workdir)
    return path
  saved = paths.join(workdir, runfiles.SPM_FILE)
  if paths.isfile(saved):
    return paths.local_file(saved)  # sentencepiece reads local files.
  return parallel.train_vocabulary(
      data_dir(s.data),
      t.source_lang,
      t.target_lang,
      int(t.vocab_size),
      cache_dir(s, workdir),
  )


def cache_dir(s: Settings, workdir: str) -> str:
  """The run's cache: ``data.cache_dir``, else ``<workdir>/cache``."""
  return s.data.cache_dir or paths.join(workdir, "cache")


def cached_vocabulary(s: Settings, workdir: str) -> str | None:
  """The run's sentencepiece model where it needs no training (given,
  saved by the run, or in the cache), else None; writes nothing."""
  t = s.of(task_config.Translation)
  if t.vocab_file:
    path = paths.resolve(t.vocab_file)
    return path if paths.isfile(path) else None
  saved = paths.join(workdir, runfiles.SPM_FILE) if workdir else ""
  if saved and paths.isfile(saved):
    return saved
  try:
    path = parallel.vocabulary_file(
        data_dir(s.data),
        t.source_lang,
        t.target_lang,
        int(t.vocab_size),
        cache_dir(s, workdir),
        remember=False,
    )
  except content.AmbiguousCacheError:
    raise
  except errors.DataError:
    return None
  return path if paths.isfile(path) else None


def is_cached(
    s: Settings, workdir: str, split: str, vocab: str | None = None
) -> bool:
  """Whether the cache holds ``split`` encoded with the run's vocabulary
  (``vocab``, default ``cached_vocabulary``), so that it is read without
  its text files or SeqIO; writes nothing."""
  t = s.of(task_config.Translation)
  vocab = vocab or cached_vocabulary(s, workdir)
  if vocab is None:
    return False
  try:
    path = parallel.encoded_file(
        data_dir(s.data),
        split,
        t.source_lang,
        t.target_lang,
        vocab,
        cache_dir(s, workdir),
        remember=False,
    )
  except content.AmbiguousCacheError:
    raise
  except errors.DataError:
    return False
  return paths.isfile(path)


def check_tokenizer(s: Settings, workdir: str, splits: tuple[str, ...]):
  """Raises MissingDependencyError, before anything is written, when a
  split must be encoded (SeqIO and TensorFlow: the ``[data]`` extra) and
  they are not installed."""
  vocab = cached_vocabulary(s, workdir)
  if vocab is None or not all(is_cached(s, workdir, x, vocab) for x in splits):
    optional.require("seqio", "tokenising parallel text")


def read_split(s: Settings, split: str, vocab_path: str, workdir: str) -> Any:
  """A split of the parallel data, encoded (``parallel.ParallelSplit``)."""
  t = s.of(task_config.Translation)
  return parallel.encode_split(
      data_dir(s.data),
      split,
      t.source_lang,
      t.target_lang,
      vocab_path,
      cache_dir(s, workdir),
  )


def make_translator(
    t: task_config.Translation,
    model: Any,
    params: Any,
    vocab: Any,
    hook: Any = None,
) -> translator_lib.Translator:
  """The beam-search translator of the ``translation`` settings ``t``."""
  return translator_lib.Translator(
      model,
      params,
      vocab,
      beam_size=t.beam_size,
      length_penalty=t.length_penalty,
      max_len_a=t.max_len_a,
      max_len_b=t.max_len_b,
      batch_size=t.decode_batch_size,
      hook=hook,
  )


def score_split(tr, split_data, max_sentences: int, desc: str) -> dict:
  """Translates a split (beam) and scores it with sacreBLEU."""
  n = len(split_data.source)
  if max_sentences:
    n = min(n, int(max_sentences))
  start = time.time()
  ids = tr.translate_ids(split_data.source[:n], desc=desc)
  hyps = [tr.vocab.decode(x) for x in ids]
  scores = bleu.score(hyps, split_data.target_text[:n])
  scores["decode_seconds"] = time.time() - start
  scores["hypotheses"] = hyps
  return scores
