"""Parallel text for translation: reading, a joint vocabulary, SeqIO tasks.

IWSLT-style data is one sentence per line in ``{split}.{lang}`` files
(``train.de`` / ``train.en``, ``valid.*``, ``test.*``); line i of the source
file translates line i of the target file. ``read_pairs`` reads a split and
refuses files of different line counts and empty lines (one line naming the
file and line). ``train_vocabulary`` trains one joint sentencepiece model on
both sides of the training split (BPE, like the IWSLT recipe's joint BPE) and
loads it as a ``vocab.SentencePieceVocabulary`` (pad 0, EOS 1, UNK 2, no
BOS; SeqIO's ``SentencePieceVocabulary`` in the tasks). ``register_task`` registers a SeqIO task for either direction with
features 'inputs' (source ids + EOS) and 'targets' (target ids + EOS);
``encode_split`` runs it and caches the ids.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
from typing import Any, Optional, Sequence

import numpy as np

from memjax import errors
from memjax.io import optional
from memjax.io import paths as paths_lib
from memjax.data import cache_files
from memjax.data import content
from memjax.data import sources
from memjax.data import spm_vocab

SPLITS = ("train", "valid", "test")
_SEQIO_SPLITS = {"train": "train", "validation": "valid", "test": "test"}
DEFAULT_DIR = os.path.join(sources.DEMO_DATA_DIR, "mt_de_en")
_CACHE_VERSION = 2


def split_files(
    data_dir: str, split: str, src: str, tgt: str
) -> tuple[str, str]:
  """The (source, target) file paths of ``split``.

  Raises:
    errors.DataError: a file is missing.
  """
  paths = tuple(paths_lib.join(data_dir, f"{split}.{l}") for l in (src, tgt))
  for p in paths:
    if not paths_lib.isfile(p):
      raise errors.DataError(
          f"missing parallel text file {p}: data.data_dir needs "
          f"{split}.{src} and {split}.{tgt}"
      )
  return paths


def _read_lines(path: str) -> list[str]:
  try:
    return paths_lib.read_text(path).splitlines()
  except UnicodeDecodeError as e:
    raise errors.DataError(f"{path} is not UTF-8 text ({e.reason})") from None


def check_pairs(
    src_lines: Sequence[str],
    tgt_lines: Sequence[str],
    src_path: str,
    tgt_path: str,
) -> None:
  """Raises DataError for unequal line counts or an empty line."""
  if len(src_lines) != len(tgt_lines):
    raise errors.DataError(
        f"{src_path} has {len(src_lines)} lines but {tgt_path} has "
        f"{len(tgt_lines)}: parallel files must align line by line"
    )
  for i, (s, t) in enumerate(zip(src_lines, tgt_lines)):
    if not s.strip() or not t.strip():
      empty = src_path if not s.strip() else tgt_path
      raise errors.DataError(
          f"empty line {i + 1} in {empty}: remove the pair from both files"
      )


def read_pairs(
    data_dir: str, split: str, src: str, tgt: str
) -> tuple[list[str], list[str]]:
  """The (source lines, target lines) of ``split``, checked.

  Raises:
    errors.DataError: a missing or non-UTF-8 file, files of different line
      counts, or an empty line.
  """
  sp, tp = split_files(data_dir, split, src, tgt)
  s, t = _read_lines(sp), _read_lines(tp)
  check_pairs(s, t, sp, tp)
  return s, t


def _where(data_dir: str) -> str:
  return paths_lib.resolve(data_dir)


def _vocabulary_what(src: str, tgt: str, vocab_size: int) -> str:
  return f"sentencepiece v{_CACHE_VERSION} {src}-{tgt} vocab_size={vocab_size}"


def vocabulary_file(
    data_dir: str,
    src: str,
    tgt: str,
    vocab_size: int,
    cache_dir: str,
    remember: bool = True,
) -> str:
  """Where ``train_vocabulary`` keeps its model: named by the training
  files' SHA-256 (``content.key``), or as recorded in the cache when they
  are missing. It may not exist yet; ``remember=False`` writes nothing.

  Raises:
    errors.DataError: a training file is missing and nothing is recorded.
  """
  key = content.key(
      _vocabulary_what(src, tgt, vocab_size),
      lambda: split_files(data_dir, "train", src, tgt),
      cache_dir,
      _where(data_dir),
      remember,
  )
  return paths_lib.join(cache_dir, f"spm_{src}{tgt}_{vocab_size}_{key}.model")


def train_vocabulary(
    data_dir: str, src: str, tgt: str, vocab_size: int, cache_dir: str
) -> str:
  """Trains (or finds cached) the joint sentencepiece model; returns its path.

  One BPE model over both sides of the training split, with pad 0, EOS 1,
  UNK 2 and no BOS (SeqIO's convention), full character coverage.
  """
  path = vocabulary_file(data_dir, src, tgt, vocab_size, cache_dir)
  if paths_lib.isfile(path):
    return path
  s, t = read_pairs(data_dir, "train", src, tgt)
  files = split_files(data_dir, "train", src, tgt)
  paths_lib.makedirs(cache_dir)
  train_sentencepiece(
      s + t,
      path,
      vocab_size,
      f"{files[0]} and {files[1]}",
      "data.vocab_size",
  )
  content.record(
      cache_dir,
      _vocabulary_what(src, tgt, vocab_size),
      _where(data_dir),
      path.rsplit("_", 1)[-1].split(".")[0],
  )
  return path


def train_sentencepiece(
    sentences: Sequence[str],
    path: str,
    vocab_size: int,
    source: str,
    config_key: str,
    user_symbols: Sequence[str] = (),
) -> str:
  """Trains a BPE sentencepiece model on ``sentences`` into ``path``.

  SeqIO's ids (pad 0, EOS 1, UNK 2, no BOS), full character coverage;
  ``user_symbols`` become pieces 3, 4, ... A vocabulary too large for the
  text is a ConfigError naming ``source`` and ``config_key``.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        user_defined_symbols=list(user_symbols),
        input_sentence_size=200000,
        shuffle_input_sentence=True,
        minloglevel=2,
    )
  except RuntimeError as e:
    raise errors.ConfigError(
        f"cannot train a {vocab_size}-piece vocabulary on {source}: "
        f"{str(e).splitlines()[-1]}; lower {config_key}"
    ) from None
  paths_lib.write_bytes(path, model.getvalue())
  return path


def load_vocabulary(path: str) -> spm_vocab.SentencePieceVocabulary:
  """The vocabulary of a sentencepiece model file (no SeqIO needed).

  Raises:
    errors.DataError: no file at ``path``.
  """
  return spm_vocab.load_sentencepiece(path)


def _pairs_dataset(
    split: str,
    shuffle_files: bool,
    seed: Optional[int] = None,
    *,
    data_dir: str,
    src: str,
    tgt: str,
) -> Any:
  """tf.data.Dataset of {'inputs', 'targets'} sentences, in order."""
  del shuffle_files, seed  # Order is kept; the batcher shuffles.
  tf = optional.tensorflow("a SeqIO translation task")

  s, t = read_pairs(data_dir, _SEQIO_SPLITS[split], src, tgt)
  return tf.data.Dataset.from_tensor_slices({"inputs": s, "targets": t})


def register_task(
    data_dir: str, src: str, tgt: str, vocab_path: str
) -> Any:  # A seqio.Task: SeqIO is imported only here.
  """Registers (once) the SeqIO task translating ``src`` into ``tgt``.

  Features: 'inputs' (source ids + EOS) and 'targets' (target ids + EOS),
  both in the joint vocabulary; splits train / validation / test.
  """
  # SeqIO and TensorFlow load when a task is first made: a run that stops at
  # its checks (or reads cached ids) never imports them.
  seqio = optional.require("seqio", "tokenising parallel text")
  from memjax.data import seqio_vocab  # pylint: disable=g-import-not-at-top

  tf = seqio_vocab.tf

  data_dir = paths_lib.resolve(data_dir)
  digest = hashlib.sha1(f"{data_dir}|{vocab_path}".encode()).hexdigest()[:8]
  name = f"memjax_mt_{src}_{tgt}_{digest}"
  if name in seqio.TaskRegistry.names():
    return seqio.TaskRegistry.get(name)
  vocab = seqio_vocab.to_seqio(load_vocabulary(vocab_path))
  source = seqio.FunctionDataSource(
      dataset_fn=functools.partial(
          _pairs_dataset, data_dir=data_dir, src=src, tgt=tgt
      ),
      splits=tuple(_SEQIO_SPLITS),
  )
  feature = seqio.Feature(vocab, add_eos=True, dtype=tf.int32)
  return seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=[
          seqio.preprocessors.tokenize,
          seqio.preprocessors.append_eos,
      ],
      output_features={"inputs": feature, "targets": feature},
      metric_fns=[],
  )


@dataclasses.dataclass
class ParallelSplit:
  """A split's sentences and their ids.

  Attributes:
    source_text: the source sentences.
    target_text: the reference translations.
    source: per sentence, int32 ids ending in EOS.
    target: per sentence, int32 ids ending in EOS.
  """

  source_text: list[str]
  target_text: list[str]
  source: list[np.ndarray]
  target: list[np.ndarray]


def _encoded_what(split: str, src: str, tgt: str, vocab_path: str) -> str:
  vocab = content.file_sha256(vocab_path)[: content.KEY_LENGTH]
  return (
      f"parallel ids v{_CACHE_VERSION} {split} {src}-{tgt} vocabulary={vocab}"
  )


def encoded_file(
    data_dir: str,
    split: str,
    src: str,
    tgt: str,
    vocab_path: str,
    cache_dir: str,
    remember: bool = True,
) -> str:
  """Where ``encode_split`` keeps a split's ids and sentences: named by the
  SHA-256 of its files and of the vocabulary (``content.key``), or as
  recorded in the cache when the files are missing. It may not exist yet;
  ``remember=False`` writes nothing.

  Raises:
    errors.DataError: a file is missing and nothing is recorded.
  """
  key = content.key(
      _encoded_what(split, src, tgt, vocab_path),
      lambda: split_files(data_dir, split, src, tgt),
      cache_dir,
      _where(data_dir),
      remember,
  )
  return paths_lib.join(cache_dir, f"mt_{split}_{src}{tgt}_{key}.npz")


def _text_array(lines: Sequence[str]) -> np.ndarray:
  """Lines (none holds a line break) as one uint8 array of UTF-8."""
  return np.frombuffer("\n".join(lines).encode("utf-8"), np.uint8)


def _text_lines(array: np.ndarray) -> list[str]:
  text = array.tobytes().decode("utf-8")
  return text.split("\n") if text else []


def encode_split(
    data_dir: str,
    split: str,
    src: str,
    tgt: str,
    vocab_path: str,
    cache_dir: str,
) -> ParallelSplit:
  """Reads ``split`` through the SeqIO task, cached (.npz of the ids and
  the sentences): a cached split needs neither SeqIO nor the text files
  (a damaged one is set aside and rebuilt, ``cache_files.read``)."""
  path = encoded_file(data_dir, split, src, tgt, vocab_path, cache_dir)
  if paths_lib.isfile(path):
    cached = cache_files.read(
        path, _read_encoded, lambda: split_files(data_dir, split, src, tgt)[0]
    )
    if cached is not None:
      return cached
  s_text, t_text = read_pairs(data_dir, split, src, tgt)
  task = register_task(data_dir, src, tgt, vocab_path)
  seqio_split = {v: k for k, v in _SEQIO_SPLITS.items()}[split]
  ds = task.get_dataset(
      sequence_length=None,
      split=seqio_split,
      shuffle=False,
      use_cached=False,
      num_epochs=1,
  )
  ins, tgs = [], []
  for ex in ds.as_numpy_iterator():
    ins.append(ex["inputs"].astype(np.int32))
    tgs.append(ex["targets"].astype(np.int32))
  paths_lib.makedirs(cache_dir)
  paths_lib.np_savez(
      path,
      inputs=np.concatenate(ins),
      input_lens=np.array([len(x) for x in ins]),
      targets=np.concatenate(tgs),
      target_lens=np.array([len(x) for x in tgs]),
      source_text=_text_array(s_text),
      target_text=_text_array(t_text),
  )
  content.record(
      cache_dir,
      _encoded_what(split, src, tgt, vocab_path),
      _where(data_dir),
      path.rsplit("_", 1)[-1].split(".")[0],
  )
  return _read_encoded(path)


def _read_encoded(path: str) -> ParallelSplit:
  """A split's cached .npz, read whole."""
  with paths_lib.np_load(path) as z:
    source = np.split(z["inputs"], np.cumsum(z["input_lens"])[:-1])
    target = np.split(z["targets"], np.cumsum(z["target_lens"])[:-1])
    s_text, t_text = _text_lines(z["source_text"]), _text_lines(
        z["target_text"]
    )
  return ParallelSplit(s_text, t_text, source, target)
