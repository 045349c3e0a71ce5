"""The tasks' settings: each task's section of the config.

Each task's settings live in a section of its own (``translation``,
``mlm``, ``classification``); the language-modelling task reads ``data``
and ``eval``, the engine's.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Translation:
  """``config.translation``: translation runs (model.family=
  'encoder_decoder', data.corpus='parallel', data.batching='tokens';
  memjax/tasks/translation, docs/translation.md).

  Attributes:
    source_lang, target_lang: the files {split}.{source_lang}.
    vocab_size: joint sentencepiece (BPE) pieces.
    vocab_file: a sentencepiece model; '' = train one.
    max_tokens: tokens per update (rows x bucket length).
    buckets: padded sentence lengths.
    beam_size, length_penalty: beam search (fairseq's lenpen).
    max_len_a, max_len_b: decode at most a * source length + b.
    decode_batch_size: sentences per decoding batch.
    eval_splits: scored after training (tune here).
    eval_max_sentences: 0 = the whole split.
    split: --mode=translate: the split scored.
    input_file: --mode=translate: translate a file instead.
    output_file: '' = <workdir>/translations/<name>.txt.
  """

  SECTION: ClassVar[str] = "translation"
  source_lang: str = "de"
  target_lang: str = "en"
  vocab_size: int = 10000
  vocab_file: str = ""
  max_tokens: int = 4096
  buckets: tuple[int, ...] = (16, 32, 64, 128)
  beam_size: int = 4
  length_penalty: float = 1.0
  max_len_a: float = 1.2
  max_len_b: int = 10
  decode_batch_size: int = 32
  eval_splits: tuple[str, ...] = ("valid",)
  eval_max_sentences: int = 0
  split: str = "test"
  input_file: str = ""
  output_file: str = ""


@dataclasses.dataclass(frozen=True)
class MaskedLM:
  """``config.mlm``: masked-LM pretraining (task='mlm',
  model.family='encoder', data.batching='mlm'; memjax/tasks/mlm.py,
  docs/pkm_bert.md).

  Attributes:
    data_dir: wiki.{train,valid,test}.tokens; '' = demo_data/wikitext.
    vocab_size: sentencepiece (BPE) pieces trained on train.
    vocab_file: a sentencepiece model with [CLS], [MASK]; '' = train one.
    mask_prob: share of tokens chosen (80/10/10 mask/random/keep).
    eval_seed: the fixed masking draw of the evaluation splits.
  """

  SECTION: ClassVar[str] = "mlm"
  data_dir: str = ""
  vocab_size: int = 8000
  vocab_file: str = ""
  mask_prob: float = 0.15
  eval_seed: int = 1234


@dataclasses.dataclass(frozen=True)
class Classification:
  """``config.classification``: sentence classification
  (task='classification', model.family='encoder' with
  family_options.head='classify', data.batching='sentences').

  Attributes:
    data_dir: {train,dev,test}.tsv; '' = the demo sentiment data.
    labels: the label set (column 'label').
    max_len: [CLS] + pieces, longer ones cut.
    buckets: padded lengths (one compile each).
    select_split: the best checkpoint is chosen on this.
    test_split: scored once, at the best dev parameters.
    usage_split: usage per class (Figure 4).
  """

  SECTION: ClassVar[str] = "classification"
  data_dir: str = ""
  labels: tuple[str, ...] = ("0", "1")
  max_len: int = 128
  buckets: tuple[int, ...] = (32, 64, 128)
  select_split: str = "dev"
  test_split: str = "test"
  usage_split: str = "dev"


SETTINGS = (Translation, MaskedLM, Classification)
