"""The engine's settings sections, typed and frozen: one dataclass each.

Each class owns one config section (``SECTION``): its fields are the
section's keys and their defaults. A task's or a method's sections are
declared beside its code, the same way (``memjax/tasks/config.py``,
``memjax/methods/<method>/config.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

# The ranges a key may declare, checked before anything is written
# (``memjax.settings.check_ranges``).
POSITIVE = "a positive integer"
NON_NEGATIVE = "an integer >= 0"
NON_NEGATIVE_REAL = "a number >= 0"
DROPOUT = "in [0, 1)"
STEP_SPAN = "() or (FIRST,COUNT), two positive integers"


def ranged(default: Any, rule: str) -> Any:
  """A field with a default and the range its values must lie in (one of
  the rules above)."""
  return dataclasses.field(default=default, metadata={"range": rule})


def frozen_dict(**kwargs: Any) -> Any:
  """A field defaulting to an empty dict (a ConfigDict in the config)."""
  return dataclasses.field(default_factory=dict, **kwargs)


@dataclasses.dataclass(frozen=True)
class Data:
  """``config.data``: the data every task reads.

  Attributes:
    corpus: wikitext103 | enwik8 | text8 | wikitext103_raw | text | ....
    data_dir: the corpus files; '' = the demo copy shipped in demo_data/.
    cache_dir: token caches, vocabularies, packings; '' = <workdir>/cache.
    seq_len: L, tokens per training segment.
    batch_size: segments per update (all micro-batches).
    batching: the batcher the engine or a method declares (random, bm25...).
    segments_per_lane: m, consecutive segments per document or lane.
    tokenizer: an imported model's workdir: raw-text corpora are read
      through its tokenizer ('' = the run's own, if it has one).
  """

  SECTION: ClassVar[str] = "data"
  corpus: str = "wikitext103"
  data_dir: str = ""
  cache_dir: str = ""
  seq_len: int = ranged(128, POSITIVE)
  batch_size: int = ranged(16, POSITIVE)
  batching: str = "random"
  segments_per_lane: int = ranged(1, POSITIVE)
  tokenizer: str = ""


@dataclasses.dataclass(frozen=True)
class Model:
  """``config.model``: the model family and its sub-layers.

  Attributes:
    family: a model family the engine or a method declares (decoder_lm,
      encoder_decoder, encoder, marge).
    family_options: the family's own settings (e.g. encoder_layers).
    num_layers, d_model, num_heads, head_dim, d_ff: the sizes.
    cutoffs: adaptive input/softmax cluster boundaries; () = plain softmax.
    adaptive_factor: embedding-dimension shrink factor per cluster.
    scale_embedding: multiply token embeddings by sqrt(D), as fairseq does
      by default (no_scale_embedding=False): with absolute positions, an
      unscaled embedding (norm ~1) is swamped by the sinusoid.
    dropout: residual, embedding and feed-forward dropout.
    adaptive_dropout: dropout inside the adaptive softmax's tail clusters
      (fairseq's adaptive_softmax_dropout).
    attention_dropout: dropout on attention probabilities.
    attention: the attention kind (vanilla | rpe | xl | lamemo).
    attention_options, feed_forward_options: the kinds' options, declared
      by one frozen dataclass per kind (``extend.kind_options``); a config
      holds every one of them (``memjax.config.settle_options``).
    feed_forward: the feed-forward kind (ffn | glu | pkm | resm | ...).
    feed_forward_layers: 1-based layer numbers that use ``feed_forward``
      (e.g. (2, 4) of 6 for product-key memory layers); the other layers
      use the plain 'ffn' with the options it takes. () = every layer; a
      negative number counts from the end (-1: the last layer).
    mem_len: recurrent memory length M (0 = none).
    max_len: longest input (position table).
    remat: rematerialise each block in the backward pass.
    remat_policy: what a rematerialised block keeps: full (nothing, its
      forward pass runs again), dots (every matmul's output),
      dots_no_batch (those without batch dimensions: not attention's),
      probs (the attention probabilities, named in the blocks) or
      probs_ffn (those and the feed-forward's hidden layer).
    scan_layers: scan runs of identical layers, their parameters stacked
      on a 'layers' axis (``memjax.models.stack``); a checkpoint restores
      into either layout.
    norm_position: 'pre' (fairseq transformer_lm_wiki103, TRIME) or 'post'
      (Transformer-XL's default pre_lnorm=False).
    norm_epsilon: the norms' epsilon (family_options.norm: LayerNorm, RMSNorm).
    activation: relu (Vaswani et al., fairseq's LMs), gelu (the exact erf
      form of HuggingFace's and XLM's BERTs; the encoder configs),
      gelu_tanh (the tanh approximation of Google's BERT and GPT-2) or silu
      (SwiGLU's gate, feed_forward 'glu'); the BERT MLM head takes it too.
    final_layer_norm: pre-LN: a LayerNorm after the last block.
    dtype: float32 | bfloat16: the compute dtype.
    param_dtype: float32 | bfloat16: the dtype the parameters are kept
      in (MaxText's ``weight_dtype``). With bfloat16 the weights take half
      the memory for evaluation, datastores and generation; training keeps
      the optimiser state and the accumulated gradients in float32 and
      rounds each update into the bfloat16 weights (``run.optim``).
    softmax_chunk: positions scored at a time by the adaptive softmax.
  """

  SECTION: ClassVar[str] = "model"
  # Keys that change how, not what, the model computes: a run may be
  # restored with other values (evaluated in bfloat16, say, or with remat).
  RUNTIME_KEYS: ClassVar[tuple[str, ...]] = (
      "remat",
      "remat_policy",
      "scan_layers",
      "dtype",
      "param_dtype",
      "softmax_chunk",
  )
  family: str = "decoder_lm"
  family_options: dict[str, Any] = frozen_dict()
  num_layers: int = ranged(4, POSITIVE)
  d_model: int = ranged(128, POSITIVE)
  num_heads: int = ranged(4, POSITIVE)
  head_dim: int = ranged(32, POSITIVE)
  d_ff: int = ranged(512, POSITIVE)
  cutoffs: tuple[int, ...] = (2000, 6000)
  adaptive_factor: int = 4
  scale_embedding: bool = True
  dropout: float = ranged(0.1, DROPOUT)
  adaptive_dropout: float = ranged(0.0, DROPOUT)
  attention_dropout: float = ranged(0.0, DROPOUT)
  attention: str = "vanilla"
  attention_options: dict[str, Any] = frozen_dict()
  feed_forward: str = "ffn"
  feed_forward_options: dict[str, Any] = frozen_dict()
  feed_forward_layers: tuple[int, ...] = ()
  mem_len: int = ranged(0, NON_NEGATIVE)
  max_len: int = 4096
  remat: bool = False
  remat_policy: str = "full"
  scan_layers: bool = False
  norm_position: str = "pre"
  norm_epsilon: float = 1e-6
  activation: str = "relu"
  final_layer_norm: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  softmax_chunk: int = 4096


@dataclasses.dataclass(frozen=True)
class Loss:
  """``config.loss``: the training objective.

  Attributes:
    name: the objective (lm, label_smoothed, or a method's: trime, ...).
    options: settings of objectives that take them (label_smoothed's
      epsilon).
  """

  SECTION: ClassVar[str] = "loss"
  name: str = "lm"
  options: dict[str, Any] = frozen_dict()


@dataclasses.dataclass(frozen=True)
class Optim:
  """``config.optim``: the optimiser, its schedule and parameter groups.

  Attributes:
    optimizer: adam | nag | sgd.
    learning_rate: the peak learning rate.
    schedule: cosine | inverse_sqrt | constant | linear.
    warmup_steps: linear warm-up updates.
    min_lr_ratio: the schedule's end as a share of the peak.
    clip_norm: clip all gradients together to this global norm (0 = none).
    weight_decay: decoupled weight decay.
    b1, b2, eps: Adam's.
    momentum: NAG's and SGD's.
    transform: an optimiser transform the engine or a method declares
      that replaces ``optimizer`` ('' = the optimizer above).
    groups: parameter groups with their own settings, e.g.
      ``c.optim.groups.embed = ConfigDict({"params": "^embedder/",
      "learning_rate": 1e-3})``: ``params`` is a regex searched in
      parameter paths ("layer_0/attention/query/kernel"), the other keys
      override the ones above (``run.optim.GROUP_KEYS``). A parameter
      may match one group at most and every group must match one.
  """

  SECTION: ClassVar[str] = "optim"
  optimizer: str = "adam"
  learning_rate: float = ranged(5e-4, NON_NEGATIVE_REAL)
  schedule: str = "cosine"
  warmup_steps: int = ranged(100, NON_NEGATIVE)
  min_lr_ratio: float = ranged(0.0, NON_NEGATIVE_REAL)
  clip_norm: float = ranged(0.0, NON_NEGATIVE_REAL)
  weight_decay: float = ranged(0.0, NON_NEGATIVE_REAL)
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-8
  momentum: float = 0.99
  transform: str = ""
  groups: dict[str, Any] = frozen_dict()


@dataclasses.dataclass(frozen=True)
class Train:
  """``config.train``: the training loop.

  Attributes:
    num_steps: updates (the schedule's horizon).
    grad_accum: micro-batches per update.
    log_every, eval_every, checkpoint_every: steps between each.
    eval_max_windows: windows per split of the periodic evaluation.
    keep_checkpoints: checkpoints kept.
    init_from: a run or export to take the shared parameters from (the
      new ones stay fresh).
    init_from_map: renames for init_from, "regex=replacement" strings
      applied in order to this model's parameter paths to find the
      source's (the first that changes a path wins).
    extend_schedule: resuming with another num_steps rebuilds the schedule
      over the new horizon (otherwise an error).
    restart_if_damaged: when every checkpoint is damaged, start again from
      step 0 instead of stopping.
    hooks: step hooks run in this order after the updates whose step is a
      multiple of their "every", before that step's checkpoint.
    hook_options: per hook name, its settings ("every", default 1, and the
      hook's own keys).
    profile_steps: (FIRST, COUNT): trace those updates with jax.profiler
      into <workdir>/profile; () = none.
  """

  SECTION: ClassVar[str] = "train"
  num_steps: int = ranged(1000, POSITIVE)
  grad_accum: int = ranged(1, POSITIVE)
  log_every: int = ranged(50, POSITIVE)
  eval_every: int = ranged(500, NON_NEGATIVE)
  eval_max_windows: int = ranged(64, NON_NEGATIVE)
  checkpoint_every: int = ranged(500, POSITIVE)
  keep_checkpoints: int = ranged(3, POSITIVE)
  init_from: str = ""
  init_from_map: tuple[str, ...] = ()
  extend_schedule: bool = False
  restart_if_damaged: bool = False
  hooks: tuple[str, ...] = ()
  hook_options: dict[str, Any] = frozen_dict()
  profile_steps: tuple[int, ...] = ranged((), STEP_SPAN)


@dataclasses.dataclass(frozen=True)
class Eval:
  """``config.eval``: evaluation of the splits, by windows or streams.

  Attributes:
    splits: the evaluation splits.
    window_len: context + scored tokens per window.
    score_len: scored tokens at the end of each window.
    batch_size: windows per batch.
    max_windows: 0 = the whole split (segments per lane for models with
      recurrent memory).
    corpus: score another corpus's valid/test, read with the run's
      vocabulary (TRIME Table 5's domain adaptation); '' = data.corpus.
    data_dir: '' = eval.corpus's demo copy.
    segment_len: recurrent models: segment length (0 = data.seq_len).
    mem_len: recurrent models: memory length (0 = model.mem_len).
    lanes: recurrent models: contiguous lanes the split is cut into.
  """

  SECTION: ClassVar[str] = "eval"
  splits: tuple[str, ...] = ("valid", "test")
  window_len: int = ranged(128, POSITIVE)
  score_len: int = ranged(64, POSITIVE)
  batch_size: int = ranged(32, POSITIVE)
  max_windows: int = ranged(0, NON_NEGATIVE)
  corpus: str = ""
  data_dir: str = ""
  segment_len: int = 0
  mem_len: int = 0
  lanes: int = 1


@dataclasses.dataclass(frozen=True)
class EvalMemory:
  """``config.eval_memory``: evaluation with testing memories (modes
  memeval, tune, memsweep, buckets) and an external datastore; the windows
  are eval.window_len / score_len. A kind's own settings (TRIME's
  temperature, the cache's lambda and theta, ...) live in its method's
  section (``trime``, ``cache``, ``external``).

  Attributes:
    kind: the evaluation memory: none, or a method's (trime, cache, knn,
      trime_ext, ...).
    long_mem_tokens: N, (g, next token) pairs before the window.
    long_mem_grid: tune: the sizes N to try; () = long_mem_tokens only.
    long_mem_span: which N pairs M_long holds: before_window = the N
      predictions before the window; last_scored = the last N scored ones
      before the window's first scored prediction (the authors' --mem-size
      N; overlaps M_local).
    sweep_tokens: memsweep: the sizes N.
    sweep_kinds: memsweep: the kinds swept (a method sets its own).
    batch_size: windows per evaluation batch.
    block_size: keys per block of the long-memory sums.
    bucket_counts: buckets: count frequencies on valid | train.
    bucket_edges: Table 14's bucket edges.
    datastore: an external memory's datastore; '' = <workdir>/datastore.
    search: scann | exact.
    ext_k: K neighbours (Appendix D).
    leaves_to_search: ScaNN leaves searched; 0 = the index's.
    reorder_candidates: ScaNN candidates re-ordered exactly per query;
      0 = max(2K, 256).
    pipeline: search batch t while t + 1 runs forward.
    rescore: the K neighbours' scores recomputed in float32 from the stored
      keys (knnlm's --knn-sim-func with the keys loaded); False = the
      scores as the search returns them (the authors' kNN-LM and
      TRIMELM_ext, --no-load-keys, as knn-transformers does). The default
      ScaNN index re-orders its candidates on exact keys, so its scores
      are exact either way; an index built with ``datastore.reorder=-1``
      returns its quantised (asymmetric hashing) scores, as the authors'
      faiss IVFPQ index its PQ distances.
  """

  SECTION: ClassVar[str] = "eval_memory"
  kind: str = "none"
  long_mem_tokens: int = 0
  long_mem_grid: tuple[int, ...] = ()
  long_mem_span: str = "before_window"
  sweep_tokens: tuple[int, ...] = (
      0,
      1024,
      2048,
      4096,
      8192,
      12288,
      16384,
      24576,
  )
  sweep_kinds: tuple[str, ...] = ()
  batch_size: int = 8
  block_size: int = 1024
  bucket_counts: str = "valid"
  bucket_edges: tuple[int, ...] = (10000, 1000, 100, 10)
  datastore: str = ""
  search: str = "scann"
  ext_k: int = 1024
  leaves_to_search: int = 0
  reorder_candidates: int = 0
  pipeline: bool = True
  rescore: bool = False


@dataclasses.dataclass(frozen=True)
class Mesh:
  """``config.mesh``: the device mesh's axis sizes (-1: the devices
  left)."""

  SECTION: ClassVar[str] = "mesh"
  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  # Data-parallel, and the axis a memory table's rows are split over.
  memory: int = 1


@dataclasses.dataclass(frozen=True)
class Datastore:
  """``config.datastore``: --mode=datastore, (g, next token) of a split, in
  shards; --mode=index and --mode=recall.

  Attributes:
    split: train | valid | test.
    corpus: build from another corpus, read with the run's vocabulary
      (Table 5); '' = data.corpus.
    data_dir: '' = datastore.corpus's demo copy.
    shard_keys: about this many keys per shard.
    batch_size: windows per batch; 0 = eval_memory.batch_size.
    max_windows: only the first this many windows (0 = all).
    process_index, process_count: k of n: this process writes shards s %
      n == k. Separate jobs set them; the default 0 of 1 writes every
      shard (every process of a multi-host job in step, as the features
      run on the global mesh); -1 / 0 take jax.process_index() /
      jax.process_count().
    leaves: ScaNN leaves per shard (0 = sqrt(n) leaves, 1/10 searched).
    reorder: candidates re-ordered exactly; 0 = max(2k, 256); -1 = none
      (the index returns its quantised scores, as faiss IVFPQ).
    recall_queries: held-out (valid) queries of --mode=recall.
    recall_leaves: --mode=recall also measures recall and time per query
      with each of these numbers of leaves searched (a recall-speed curve).
    recall_examples: and writes the exact neighbours of this many of its
      queries (token ids) to recall.json.
  """

  SECTION: ClassVar[str] = "datastore"
  split: str = "train"
  corpus: str = ""
  data_dir: str = ""
  shard_keys: int = 1_000_000
  batch_size: int = 0
  max_windows: int = 0
  process_index: int = 0
  process_count: int = 1
  leaves: int = 0
  reorder: int = 0
  recall_queries: int = 1000
  recall_leaves: tuple[int, ...] = ()
  recall_examples: int = 0


# The engine's sections every run reads, in the order the base config lists
# them (the modes' own sections live beside their modes).
ENGINE = (Data, Model, Loss, Optim, Train, Eval, EvalMemory, Mesh)
# The keys at the top of the config.
TOP_KEYS = {"name": "vanilla", "seed": 0, "task": "lm"}
