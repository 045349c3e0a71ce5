"""The base experiment configuration every ``configs/*.py`` file starts from.

Every key a run understands is in the base config, so an unknown
``--config.x=...`` override is rejected by ml_collections instead of being
silently ignored: the engine's keys are defined here, each task's and each
method's beside its code. Experiment files set values and named variants.
"""

from __future__ import annotations

import importlib

import ml_collections

from memjax import errors
from memjax import registry


def base_config() -> ml_collections.ConfigDict:
  """Returns the default configuration (a small vanilla LM on the demo corpus).

  The engine's sections come first; then each task's (``memjax/tasks/
  config.py``) and each method's (its package's ``CONFIG``, e.g.
  ``memjax/methods/trime/config.py``) add the keys they own, into their own
  sections or the engine's (``loss.memory``, ``eval_memory.temperature``).
  """
  c = ml_collections.ConfigDict()
  c.name = "vanilla"
  c.seed = 0
  # What the run learns from and how it is scored: a name in
  # memjax.registry.TASKS (lm: a corpus as token streams, perplexity / bpc).
  c.task = "lm"
  for section in ENGINE_SECTIONS:
    section(c)
  for target in TASK_SECTIONS + registry.method_config_sections():
    module, fn = target.split(":")
    getattr(importlib.import_module(module), fn)(c)
  return c


def _data(c: ml_collections.ConfigDict) -> None:
  """The data every task reads."""
  c.data = ml_collections.ConfigDict()
  c.data.corpus = "wikitext103"  # wikitext103 | enwik8 | text8
  c.data.data_dir = ""  # "" = the demo copy shipped in demo_data/
  c.data.cache_dir = ""  # "" = <workdir>/cache
  c.data.seq_len = 128  # L, tokens per training segment
  c.data.batch_size = 16  # segments per update (all micro-batches)
  # A name in memjax.registry.BATCHERS: random | consecutive | blocks | bm25.
  c.data.batching = "random"
  c.data.segments_per_lane = 1  # m, consecutive segments per document/lane


def _model(c: ml_collections.ConfigDict) -> None:
  """The model family and its sub-layers."""
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
  # The feed-forward's activation: relu (Vaswani et al., fairseq's LMs) or
  # gelu (BERT's exact erf form; the encoder configs).
  c.model.activation = "relu"
  c.model.final_layer_norm = True  # pre-LN: LayerNorm after the last block
  c.model.dtype = "float32"  # float32 | bfloat16
  c.model.softmax_chunk = 4096


def _loss(c: ml_collections.ConfigDict) -> None:
  """The training objective."""
  c.loss = ml_collections.ConfigDict()
  # A name in memjax.registry.OBJECTIVES: lm (the plain objective),
  # label_smoothed, or a method's.
  c.loss.name = "lm"
  c.loss.options = ml_collections.ConfigDict()  # settings of other objectives


def _optim(c: ml_collections.ConfigDict) -> None:
  """The optimiser, its schedule and parameter groups."""
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
  # A transformation registered with memjax.run.optim.register_transform that
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


def _train(c: ml_collections.ConfigDict) -> None:
  """The training loop."""
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
  # When every checkpoint of the workdir is damaged (set aside as
  # checkpoints/damaged-<step>), start again from step 0 instead of stopping.
  c.train.restart_if_damaged = False
  # Step hooks (memjax.run.hooks.register_hook), run in this order after the
  # updates whose step is a multiple of their "every", before that step's
  # checkpoint; their state is saved with every checkpoint.
  c.train.hooks = ()
  # Per hook name, a ConfigDict of its settings: "every" (steps between
  # calls, default 1) and any keys of the hook's own, e.g.
  #   c.train.hook_options.reindex = ml_collections.ConfigDict({"every": 500})
  c.train.hook_options = ml_collections.ConfigDict()
  # (FIRST, COUNT): trace updates FIRST..FIRST+COUNT-1 (1-based, as in the
  # progress lines) with jax.profiler into <workdir>/profile, for
  # TensorBoard's profile plugin; () = no trace (memjax/run/profiling.py).
  c.train.profile_steps = ()


def _eval(c: ml_collections.ConfigDict) -> None:
  """Evaluation of the splits, by windows or carried streams."""
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


def _position_loss(c: ml_collections.ConfigDict) -> None:
  """--mode=position_loss."""
  # --mode=position_loss: mean loss by position within a document, context
  # reset at document boundaries (Komatsuzaki 2021, Appendix 6.3.4).
  c.position_loss = ml_collections.ConfigDict()
  c.position_loss.documents = "articles"  # articles | sections
  c.position_loss.buckets = (1, 17, 65, 257)  # lower bounds of the buckets
  # none: the model alone (a model that carries memory carries it within each
  # document); eval: a windowed model with its evaluation memory (tune.json,
  # else eval_memory: e.g. kind=knn for a kNN-LM row).
  c.position_loss.memory = "none"


def _generate(c: ml_collections.ConfigDict) -> None:
  """--mode=generate."""
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


def _eval_memory(c: ml_collections.ConfigDict) -> None:
  """Evaluation with testing memories and an external datastore."""
  # Evaluation with testing memories (modes memeval, tune, memsweep, buckets;
  # memjax/eval/memory_grid.py). The windows are eval.window_len / score_len.
  c.eval_memory = em = ml_collections.ConfigDict()
  # A name in memjax.registry.EVAL_MEMORIES: none, or a method's (trime,
  # cache, knn, trime_ext, ...; each adds its settings to this section).
  em.kind = "none"
  em.long_mem_tokens = 0  # N: (g, next token) pairs before the window
  em.long_mem_grid = ()  # tune: sizes N to try; () = long_mem_tokens only
  # Which N pairs M_long holds: before_window = the N predictions before the
  # window; last_scored = the last N scored ones before the window's first
  # scored prediction (the authors' --mem-size N; overlaps M_local).
  em.long_mem_span = "before_window"
  em.sweep_tokens = (0, 1024, 2048, 4096, 8192, 12288, 16384, 24576)
  em.sweep_kinds = ()  # memsweep: the kinds swept (a method sets its own)
  em.batch_size = 8  # windows per evaluation batch
  em.block_size = 1024  # keys per block of the long-memory sums
  em.bucket_counts = "valid"  # buckets: count frequencies on valid | train
  em.bucket_edges = (10000, 1000, 100, 10)  # Table 14's bucket edges
  # An external memory (kinds with an external_metric): a datastore of
  # (g, next token) searched with its ScaNN index or exactly
  # (memjax/eval/external.py).
  em.datastore = ""  # "" = <workdir>/datastore
  em.search = "scann"  # scann | exact
  em.ext_k = 1024  # K neighbours (Appendix D)
  em.leaves_to_search = 0  # ScaNN leaves searched; 0 = index's
  # ScaNN candidates re-ordered exactly per query; 0 = max(2K, 256).
  em.reorder_candidates = 0
  em.pipeline = True  # search batch t while t+1 runs forward


def _export(c: ml_collections.ConfigDict) -> None:
  """--mode=export."""
  # --mode=export: a params-only, self-contained copy of the run.
  c.export = ml_collections.ConfigDict()
  c.export.dir = ""  # "" = <workdir>/export
  c.export.dtype = "float32"  # float32 | bfloat16


def _mesh(c: ml_collections.ConfigDict) -> None:
  """The device mesh."""
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1


def _plan(c: ml_collections.ConfigDict) -> None:
  """--mode=plan (memjax/modes/plan.py, docs/plan.md)."""
  # --mode=plan: compile the train step for a target without running it.
  c.plan = ml_collections.ConfigDict()
  # Devices planned for; 0 = the devices the mesh names (its fixed axes).
  c.plan.devices = 0
  # A name in memjax/modes/platforms.py: tpu_v4 | tpu_v5e | tpu_v5p | h100 |
  # h200 | a100 | cpu.
  c.plan.platform = "cpu"
  # Compile TPU platforms against a libtpu topology when libtpu is
  # installed (else on fake CPU devices, labelled as estimates).
  c.plan.tpu_topology = True
  c.plan.tpu_shape = ""  # e.g. "4x8x8"; "" = the standard slice of devices
  # V of the planned model; 0 = the config's (translation.vocab_size,
  # mlm.vocab_size) or the corpus's published vocabulary.
  c.plan.vocab_size = 0
  c.plan.utilization = 0.4  # share of the peak FLOP/s for the step time
  c.plan.memory_fraction = 0.0  # usable share of memory; 0 = platform's
  c.plan.dtypes = ("float32", "bfloat16")
  # Also compile a micro-batch twice as large to find the largest that fits.
  c.plan.fit_batch = True


ENGINE_SECTIONS = (
    _data, _model, _loss, _optim, _train, _eval, _position_loss, _generate,
    _eval_memory, _export, _mesh, _plan,
)  # fmt: skip
# The tasks' sections ('module:function'); the methods' are found by the
# registry.
TASK_SECTIONS = (
    "memjax.tasks.config:translation",
    "memjax.tasks.config:mlm",
    "memjax.tasks.config:classification",
)


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
