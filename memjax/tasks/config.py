"""The tasks' config sections, added to ``memjax.config.base_config``.

Each task's settings live in a section of its own (``translation``,
``mlm``, ``classification``); the language-modelling task reads ``data``
and ``eval``, the engine's.
"""

import ml_collections


def translation(c: ml_collections.ConfigDict) -> None:
  """Translation runs (model.family='encoder_decoder', data.corpus='parallel',
  data.batching='tokens'; memjax/tasks/translation, docs/translation.md)."""
  c.translation = t = ml_collections.ConfigDict()
  t.source_lang = "de"  # files {split}.{source_lang}
  t.target_lang = "en"
  t.vocab_size = 10000  # joint sentencepiece (BPE) pieces
  t.vocab_file = ""  # a sentencepiece model; "" = train one
  t.max_tokens = 4096  # tokens per update (rows x bucket length)
  t.buckets = (16, 32, 64, 128)  # padded sentence lengths
  t.beam_size = 4
  t.length_penalty = 1.0  # fairseq lenpen
  t.max_len_a = 1.2  # decode at most a * source length + b
  t.max_len_b = 10
  t.decode_batch_size = 32  # sentences per decoding batch
  t.eval_splits = ("valid",)  # scored after training (tune here)
  t.eval_max_sentences = 0  # 0 = the whole split
  t.split = "test"  # --mode=translate: the split scored
  t.input_file = ""  # --mode=translate: translate a file instead
  t.output_file = ""  # "" = <workdir>/translations/<name>.txt


def mlm(c: ml_collections.ConfigDict) -> None:
  """Masked-LM pretraining (task='mlm', model.family='encoder',
  data.batching='mlm'; memjax/tasks/mlm.py, docs/pkm_bert.md)."""
  c.mlm = m = ml_collections.ConfigDict()
  m.data_dir = ""  # wiki.{train,valid,test}.tokens; "" = demo_data/wikitext
  m.vocab_size = 8000  # sentencepiece (BPE) pieces trained on train
  m.vocab_file = ""  # a sentencepiece model with [CLS], [MASK]; "" = train
  m.mask_prob = 0.15  # share of tokens chosen (80/10/10 mask/random/keep)
  m.eval_seed = 1234  # the fixed masking draw of the evaluation splits


def classification(c: ml_collections.ConfigDict) -> None:
  """Sentence classification (task='classification', model.family='encoder'
  with family_options.head='classify', data.batching='sentences')."""
  c.classification = s = ml_collections.ConfigDict()
  s.data_dir = ""  # {train,dev,test}.tsv; "" = demo sentiment
  s.labels = ("0", "1")  # the label set (column 'label')
  s.max_len = 128  # [CLS] + pieces, longer ones cut
  s.buckets = (32, 64, 128)  # padded lengths (one compile each)
  s.select_split = "dev"  # best checkpoint chosen on this
  s.test_split = "test"  # scored once, at the best dev params
  s.usage_split = "dev"  # usage per class (Figure 4)
