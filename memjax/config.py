"""The base experiment configuration every ``configs/*.py`` file starts from.

Every key a run understands is defined here, so an unknown
``--config.x=...`` override is rejected by ml_collections instead of being
silently ignored. Experiment files set values and named variants.
"""

from __future__ import annotations

import ml_collections

from memjax import errors


def base_config() -> ml_collections.ConfigDict:
  """Returns the default configuration (a small vanilla LM on the demo corpus)."""
  c = ml_collections.ConfigDict()
  c.name = "vanilla"
  c.seed = 0
  # What the run learns from and how it is scored: a name in
  # memjax.registry.TASKS (lm: a corpus as token streams, perplexity / bpc).
  c.task = "lm"

  c.data = ml_collections.ConfigDict()
  c.data.corpus = "wikitext103"  # wikitext103 | enwik8 | text8
  c.data.data_dir = ""  # "" = the demo copy shipped in demo_data/
  c.data.cache_dir = ""  # "" = <workdir>/cache
  c.data.seq_len = 128  # L, tokens per training segment
  c.data.batch_size = 16  # segments per update (all micro-batches)
  # A name in memjax.registry.BATCHERS: random | consecutive | blocks | bm25.
  c.data.batching = "random"
  c.data.segments_per_lane = 1  # m, consecutive segments per document/lane
  c.data.bm25_k = 20  # bm25 batching: hits per query (Algorithm 1)
  c.data.bm25_seed = 0  # bm25 batching: seeds the chain's random starts
  c.data.bm25_stopwords = (
      False  # bm25 batching: drop English stop words (word corpora)
  )

  c.model = ml_collections.ConfigDict()
  c.model.family = "decoder_lm"  # a name in memjax.registry.MODEL_FAMILIES
  # Settings of the model family ('encoder_decoder': encoder_layers).
  c.model.family_options = ml_collections.ConfigDict()
  c.model.num_layers = 4
  c.model.d_model = 128
  c.model.num_heads = 4
  c.model.head_dim = 32
  c.model.d_ff = 512
  c.model.cutoffs = (2000, 6000)  # adaptive input/softmax; () = plain softmax
  c.model.adaptive_factor = 4
  # Multiply token embeddings by sqrt(D), as fairseq does by default
  # (no_scale_embedding=False): with absolute positions, an unscaled
  # embedding (norm ~1) is swamped by the sinusoid (norm sqrt(D/2)).
  c.model.scale_embedding = True
  c.model.dropout = 0.1
  # Dropout inside the adaptive softmax's tail clusters (fairseq's
  # adaptive_softmax_dropout), between each cluster's projection and output.
  c.model.adaptive_dropout = 0.0
  c.model.attention_dropout = 0.0
  # Sub-layers by name in memjax.registry.ATTENTION / FEED_FORWARD, with
  # their own options (module attributes of that kind).
  c.model.attention = "vanilla"  # vanilla | rpe | xl | lamemo
  c.model.attention_options = ml_collections.ConfigDict()
  c.model.feed_forward = "ffn"  # ffn | pkm | resm
  c.model.feed_forward_options = ml_collections.ConfigDict()
  # 1-based layer numbers that use model.feed_forward (e.g. (2, 4) of 6 for
  # product-key memory layers); the other layers use the plain "ffn" with the
  # options it takes. () = every layer.
  c.model.feed_forward_layers = ()
  c.model.mem_len = 0
  c.model.max_len = 4096
  c.model.remat = False
  # LayerNorm placement: 'pre' (fairseq transformer_lm_wiki103, TRIME) or
  # 'post' (Transformer-XL's default pre_lnorm=False), and its epsilon.
  c.model.norm_position = "pre"
  c.model.norm_epsilon = 1e-6
  c.model.final_layer_norm = True  # pre-LN: LayerNorm after the last block
  c.model.dtype = "float32"  # float32 | bfloat16
  c.model.softmax_chunk = 4096

  c.loss = ml_collections.ConfigDict()
  # A name in memjax.registry.OBJECTIVES: lm (the plain objective) | trime.
  c.loss.name = "lm"
  c.loss.memory = "local"  # trime training memory: local | long | external
  c.loss.lm_warmup_fraction = 0.05  # trime: first updates use the plain LM loss
  c.loss.local_hide_prob = 0.9  # trime external: p of hiding the local memory
  c.loss.stop_gradient_memory = (
      False  # trime ablation: no gradient into memory keys
  )
  c.loss.block_size = 1024  # trime: keys per block of the blockwise loss
  c.loss.options = ml_collections.ConfigDict()  # settings of other objectives

  c.optim = ml_collections.ConfigDict()
  c.optim.optimizer = "adam"  # adam | nag | sgd
  c.optim.learning_rate = 5e-4
  c.optim.schedule = "cosine"  # cosine | inverse_sqrt | constant | linear
  c.optim.warmup_steps = 100
  c.optim.min_lr_ratio = 0.0
  c.optim.clip_norm = 0.0
  c.optim.weight_decay = 0.0
  c.optim.b1 = 0.9
  c.optim.b2 = 0.98
  c.optim.eps = 1e-8
  c.optim.momentum = 0.99
  # A transformation registered with memjax.optim.register_transform that
  # replaces optim.optimizer ("" = the optimizer above).
  c.optim.transform = ""
  # Parameter groups with their own optimiser settings, e.g.
  #   c.optim.groups.embed = ml_collections.ConfigDict(
  #       {"params": "^embedder/", "learning_rate": 1e-3})
  # Each group has "params", a regex searched in parameter paths such as
  # "layer_0/attention/query/kernel", and overrides of optimizer,
  # learning_rate, schedule, warmup_steps, min_lr_ratio, weight_decay, b1,
  # b2, eps, momentum, transform. A parameter may match one group at most and
  # every group must match some parameter; the rest use the settings above.
  # clip_norm clips all gradients together; train/lr logs the base schedule.
  c.optim.groups = ml_collections.ConfigDict()

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 1000
  c.train.grad_accum = 1  # micro-batches per update
  c.train.log_every = 50
  c.train.eval_every = 500
  c.train.eval_max_windows = 64  # windows per split for periodic evaluation
  c.train.checkpoint_every = 500
  c.train.keep_checkpoints = 3
  # A run or export to take the shared parameters from (new ones stay fresh).
  c.train.init_from = ""
  # Renames for init_from: "regex=replacement" strings applied in order to
  # this model's parameter paths to find the source's (re.sub; the first
  # that changes a path wins), e.g. "(layer_3/ffn)/dense/=\\1/" takes a
  # residual memory layer's FFN from a plain FFN of the source.
  c.train.init_from_map = ()
  # Resuming with another num_steps rebuilds the schedule over the new
  # horizon (otherwise it is an error: the schedule would silently stretch).
  c.train.extend_schedule = False
  # Step hooks (memjax.hooks.register_hook), run in this order after the
  # updates whose step is a multiple of their "every", before that step's
  # checkpoint; their state is saved with every checkpoint.
  c.train.hooks = ()
  # Per hook name, a ConfigDict of its settings: "every" (steps between
  # calls, default 1) and any keys of the hook's own, e.g.
  #   c.train.hook_options.reindex = ml_collections.ConfigDict({"every": 500})
  c.train.hook_options = ml_collections.ConfigDict()

  c.eval = ml_collections.ConfigDict()
  c.eval.splits = ("valid", "test")
  c.eval.window_len = 128  # context + scored tokens per window
  c.eval.score_len = 64  # scored tokens at the end of each window
  c.eval.batch_size = 32
  c.eval.max_windows = 0  # 0 = the whole split
  # Score another corpus's valid/test, read with the run's vocabulary (TRIME
  # Table 5's domain adaptation, e.g. iwslt_en for a WikiText model).
  c.eval.corpus = ""  # "" = data.corpus
  c.eval.data_dir = ""  # "" = eval.corpus's demo copy
  # Models with recurrent memory (xl, lamemo) are scored over whole streams
  # in lanes, carrying the memory (memjax/eval/streams.py); max_windows
  # then counts segments per lane.
  c.eval.segment_len = 0  # segment length (0 = data.seq_len)
  c.eval.mem_len = 0  # memory length (0 = model.mem_len)
  c.eval.lanes = 1  # contiguous lanes the split is cut into

  # --mode=position_loss: mean loss by position within a document, context
  # reset at document boundaries (Komatsuzaki 2021, Appendix 6.3.4).
  c.position_loss = ml_collections.ConfigDict()
  c.position_loss.documents = "articles"  # articles | sections
  c.position_loss.buckets = (1, 17, 65, 257)  # lower bounds of the buckets
  # none: the model alone (a model that carries memory carries it within each
  # document); eval: a windowed model with its evaluation memory (tune.json,
  # else eval_memory: e.g. kind=knn for a kNN-LM row).
  c.position_loss.memory = "none"

  # --mode=extrapolate: memories of m x segment length (LaMemo, Figure 5).
  c.extrapolate = ml_collections.ConfigDict()
  c.extrapolate.ratios = tuple(range(1, 11))
  c.extrapolate.split = "valid"
  c.extrapolate.max_segments = 0  # segments per lane (0 = whole split)

  # --mode=analyze: alpha by layer and memory slot, attention by distance.
  c.analyze = ml_collections.ConfigDict()
  c.analyze.split = "valid"
  c.analyze.num_segments = 100  # segments per lane averaged over

  # --mode=memory_usage: MU, top-1 MU, KL_u, KL_w of each product-key
  # memory over held-out data, in windows of eval.window_len.
  c.memory_usage = ml_collections.ConfigDict()
  c.memory_usage.split = "valid"
  c.memory_usage.max_tokens = 0  # 0 = the whole split
  # Also every kept checkpoint: slots last used as top-1 at each (Figure 2).
  c.memory_usage.staleness = False

  # --mode=generate: top-p sampling after a prompt from a split.
  c.generate = ml_collections.ConfigDict()
  c.generate.split = "test"
  c.generate.prompt_offset = 0  # first prompt token in the split
  c.generate.prompt_len = 512
  c.generate.num_tokens = 256
  c.generate.top_p = 0.95
  c.generate.temperature = 1.0
  c.generate.mem_len = 0  # memory length (0 = model.mem_len)
  c.generate.seed = 0

  # Evaluation with testing memories (modes memeval, tune, memsweep, buckets;
  # memjax/eval/memory_grid.py). The windows are eval.window_len / score_len.
  c.eval_memory = ml_collections.ConfigDict()
  # A name in memjax.registry.EVAL_MEMORIES: none | trime (Eq. 6) | cache
  # (Grave et al.).
  c.eval_memory.kind = "none"
  c.eval_memory.long_mem_tokens = (
      0  # N: (g, next token) pairs before the window
  )
  c.eval_memory.temperature = 1.0  # tau: divides the memory logits only
  c.eval_memory.cache_lambda = 0.1  # cache interpolation weight
  c.eval_memory.cache_theta = 0.05  # cache inverse temperature (no 1/sqrt(d))
  c.eval_memory.temperature_grid = (0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
  c.eval_memory.cache_lambda_grid = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
  c.eval_memory.cache_theta_grid = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
  c.eval_memory.long_mem_grid = ()  # tune: sizes N to try; () = long_mem_tokens only
  c.eval_memory.sweep_tokens = (0, 1024, 2048, 4096, 8192, 12288, 16384, 24576)
  c.eval_memory.sweep_kinds = ("trime", "cache")
  c.eval_memory.cache_workdir = (
      ""  # memsweep: run whose checkpoint the cache uses
  )
  c.eval_memory.batch_size = 8  # windows per evaluation batch
  c.eval_memory.block_size = 1024  # keys per block of the long-memory sums
  c.eval_memory.bucket_counts = (
      "valid"  # buckets: count frequencies on valid | train
  )
  c.eval_memory.bucket_edges = (10000, 1000, 100, 10)  # Table 14's bucket edges
  # External memory (kinds knn and trime_ext; memjax/eval/external.py):
  # a datastore of (g, next token) built by --mode=datastore, searched with
  # the ScaNN index of --mode=index or exactly.
  c.eval_memory.external_kind = ""  # the method's kind with M_ext (demos)
  c.eval_memory.datastore = ""  # "" = <workdir>/datastore
  c.eval_memory.search = "scann"  # scann | exact
  c.eval_memory.ext_k = 1024  # K neighbours (Appendix D)
  c.eval_memory.leaves_to_search = 0  # ScaNN leaves searched; 0 = index's
  # ScaNN candidates re-ordered exactly per query; 0 = max(2K, 256).
  c.eval_memory.reorder_candidates = 0
  c.eval_memory.pipeline = True  # search batch t while t+1 runs forward
  c.eval_memory.ext_temperature = 10.5  # tau' of Eq. 8 (trime_ext)
  c.eval_memory.ext_lambda = 0.3  # lambda of Eq. 9 (trime_ext); 0 = Eq. 6
  c.eval_memory.ext_temperature_grid = (2.0, 5.0, 10.5, 20.0, 40.0)
  c.eval_memory.ext_lambda_grid = (0.0, 0.1, 0.2, 0.3, 0.5)
  c.eval_memory.knn_temperature = 1.0  # kNN-LM: none, as in Khandelwal et al.
  c.eval_memory.knn_lambda = 0.25  # kNN-LM interpolation weight
  c.eval_memory.knn_temperature_grid = (1.0,)
  c.eval_memory.knn_lambda_grid = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5)

  # --mode=datastore: (g, next token) of a split, in shards (datastore.py).
  c.datastore = ml_collections.ConfigDict()
  c.datastore.split = "train"  # train | valid | test
  # Build from another corpus, read with the run's vocabulary (Table 5).
  c.datastore.corpus = ""  # "" = data.corpus
  c.datastore.data_dir = ""  # "" = datastore.corpus's demo copy
  c.datastore.shard_keys = 1_000_000  # about this many keys per shard
  c.datastore.batch_size = 0  # windows per batch; 0 = eval_memory.batch_size
  c.datastore.max_windows = 0  # only the first this many windows (0 = all)
  c.datastore.process_index = 0  # k: this process writes shards s % n == k
  c.datastore.process_count = 1  # n
  # --mode=index / recall: ScaNN per shard (0 = sqrt(n) leaves, 1/10 searched).
  c.datastore.leaves = 0
  c.datastore.reorder = 0  # candidates re-ordered exactly; 0 = max(2k, 256)
  c.datastore.recall_queries = 1000  # held-out (valid) queries of --mode=recall

  # --mode=export: a params-only, self-contained copy of the run.
  c.export = ml_collections.ConfigDict()
  c.export.dir = ""  # "" = <workdir>/export
  c.export.dtype = "float32"  # float32 | bfloat16

  # Translation runs (model.family='encoder_decoder', data.corpus='parallel',
  # data.batching='tokens'; memjax/translation, docs/translation.md).
  c.translation = ml_collections.ConfigDict()
  c.translation.source_lang = "de"  # files {split}.{source_lang}
  c.translation.target_lang = "en"
  c.translation.vocab_size = 10000  # joint sentencepiece (BPE) pieces
  c.translation.vocab_file = ""  # a sentencepiece model; "" = train one
  c.translation.max_tokens = 4096  # tokens per update (rows x bucket length)
  c.translation.buckets = (16, 32, 64, 128)  # padded sentence lengths
  c.translation.beam_size = 4
  c.translation.length_penalty = 1.0  # fairseq lenpen
  c.translation.max_len_a = 1.2  # decode at most a * source length + b
  c.translation.max_len_b = 10
  c.translation.decode_batch_size = 32  # sentences per decoding batch
  c.translation.eval_splits = ("valid",)  # scored after training (tune here)
  c.translation.eval_max_sentences = 0  # 0 = the whole split
  c.translation.split = "test"  # --mode=translate: the split scored
  c.translation.input_file = ""  # --mode=translate: translate a file instead
  c.translation.output_file = ""  # "" = <workdir>/translations/<name>.txt

  # Masked-LM pretraining (task='mlm', model.family='encoder',
  # data.batching='mlm'; memjax/tasks/mlm.py, docs/pkm_bert.md).
  c.mlm = ml_collections.ConfigDict()
  c.mlm.data_dir = ""  # wiki.{train,valid,test}.tokens; "" = demo_data/wikitext
  c.mlm.vocab_size = 8000  # sentencepiece (BPE) pieces trained on train
  c.mlm.vocab_file = ""  # a sentencepiece model with [CLS], [MASK]; "" = train
  c.mlm.mask_prob = 0.15  # share of tokens chosen (80/10/10 mask/random/keep)
  c.mlm.eval_seed = 1234  # the fixed masking draw of the evaluation splits

  # Sentence classification (task='classification', model.family='encoder'
  # with family_options.head='classify', data.batching='sentences').
  c.classification = ml_collections.ConfigDict()
  c.classification.data_dir = ""  # {train,dev,test}.tsv; "" = demo sentiment
  c.classification.labels = ("0", "1")  # the label set (column 'label')
  c.classification.max_len = 128  # [CLS] + pieces, longer ones cut
  c.classification.buckets = (32, 64, 128)  # padded lengths (one compile each)
  c.classification.select_split = "dev"  # best checkpoint chosen on this
  c.classification.test_split = "test"  # scored once, at the best dev params
  c.classification.usage_split = "dev"  # usage per class (Figure 4)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  return c


def parse_variant(
    arg: str, sizes: tuple[str, ...], methods: tuple[str, ...]
) -> tuple[str, str]:
  """Splits a config argument 'method_size' (method optional) into parts.

  Raises:
    ValueError: naming the accepted variants.
  """
  arg = (arg or "demo").strip()
  for size in sorted(sizes, key=len, reverse=True):
    if arg == size:
      return methods[0], size
    if arg.endswith("_" + size) and arg[: -len(size) - 1] in methods:
      return arg[: -len(size) - 1], size
  raise errors.ConfigError(
      f"unknown config variant {arg!r}; use SIZE or METHOD_SIZE with SIZE in "
      f"{sizes} and METHOD in {methods}"
  )
