"""A run's settings, typed and frozen: one dataclass per config section.

The ConfigDict is the user's interface (``configs/*.py``, ``--config.*``
overrides, ``config.json``); ``memjax.build`` reads it once into these
dataclasses, and everything below takes them, or the few fields it needs.
Each class is also where its section's keys and defaults are declared:
``memjax.config.base_config`` is made from the classes' defaults (the
engine's here, each task's and each method's beside its code), so a key
has one home.

A class names its section (``SECTION``); several classes may add keys to
one section (TRIME's ``loss.memory`` sits beside the engine's ``loss.name``),
each reading only its own. ``Settings`` holds every section of a run:
the engine's as attributes (``settings.data.seq_len``), a task's or a
method's by its class (``settings.of(Extrapolate).ratios``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Iterable, Mapping, TypeVar

import ml_collections

from memjax import errors

T = TypeVar("T")


def plain(value: Any) -> Any:
  """A config value as plain Python: ConfigDicts as dicts, lists as
  tuples (a config saved as JSON reads its tuples back as lists)."""
  if isinstance(value, (ml_collections.ConfigDict, Mapping)):
    items = value.items()
    return {k: plain(v) for k, v in items}
  if isinstance(value, list):
    return tuple(plain(v) for v in value)
  return value


def read(cls: type[T], section: Any) -> T:
  """The instance of ``cls`` that a config section holds (its own keys
  only; the keys other classes add to the section are left to them)."""
  names = [f.name for f in dataclasses.fields(cls)]
  return cls(**{n: plain(section[n]) for n in names})


def section_defaults(cls: type) -> dict[str, Any]:
  """{key: default} of a settings class, in declaration order."""
  out = {}
  for f in dataclasses.fields(cls):
    if f.default is not dataclasses.MISSING:
      out[f.name] = f.default
    else:
      out[f.name] = f.default_factory()  # type: ignore[misc]
  return out


def frozen_dict(**kwargs: Any) -> Any:
  """A field defaulting to an empty dict (a ConfigDict in the config)."""
  return dataclasses.field(default_factory=dict, **kwargs)


# The engine's sections ------------------------------------------------------


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
  seq_len: int = 128
  batch_size: int = 16
  batching: str = "random"
  segments_per_lane: int = 1
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
      use the plain 'ffn' with the options it takes. () = every layer.
    mem_len: recurrent memory length M (0 = none).
    max_len: longest input (position table).
    remat: rematerialise each block in the backward pass.
    remat_policy: what a rematerialised block keeps: full (nothing, its
      forward pass runs again), dots (every matmul's output) or
      dots_no_batch (those without batch dimensions: not attention's).
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
    dtype: float32 | bfloat16 (compute; parameters stay float32).
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
      "softmax_chunk",
  )
  family: str = "decoder_lm"
  family_options: dict[str, Any] = frozen_dict()
  num_layers: int = 4
  d_model: int = 128
  num_heads: int = 4
  head_dim: int = 32
  d_ff: int = 512
  cutoffs: tuple[int, ...] = (2000, 6000)
  adaptive_factor: int = 4
  scale_embedding: bool = True
  dropout: float = 0.1
  adaptive_dropout: float = 0.0
  attention_dropout: float = 0.0
  attention: str = "vanilla"
  attention_options: dict[str, Any] = frozen_dict()
  feed_forward: str = "ffn"
  feed_forward_options: dict[str, Any] = frozen_dict()
  feed_forward_layers: tuple[int, ...] = ()
  mem_len: int = 0
  max_len: int = 4096
  remat: bool = False
  remat_policy: str = "full"
  scan_layers: bool = False
  norm_position: str = "pre"
  norm_epsilon: float = 1e-6
  activation: str = "relu"
  final_layer_norm: bool = True
  dtype: str = "float32"
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
  learning_rate: float = 5e-4
  schedule: str = "cosine"
  warmup_steps: int = 100
  min_lr_ratio: float = 0.0
  clip_norm: float = 0.0
  weight_decay: float = 0.0
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
  num_steps: int = 1000
  grad_accum: int = 1
  log_every: int = 50
  eval_every: int = 500
  eval_max_windows: int = 64
  checkpoint_every: int = 500
  keep_checkpoints: int = 3
  init_from: str = ""
  init_from_map: tuple[str, ...] = ()
  extend_schedule: bool = False
  restart_if_damaged: bool = False
  hooks: tuple[str, ...] = ()
  hook_options: dict[str, Any] = frozen_dict()
  profile_steps: tuple[int, ...] = ()


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
  window_len: int = 128
  score_len: int = 64
  batch_size: int = 32
  max_windows: int = 0
  corpus: str = ""
  data_dir: str = ""
  segment_len: int = 0
  mem_len: int = 0
  lanes: int = 1


@dataclasses.dataclass(frozen=True)
class EvalMemory:
  """``config.eval_memory``: evaluation with testing memories (modes
  memeval, tune, memsweep, buckets) and an external datastore; the windows
  are eval.window_len / score_len. A kind adds its own keys to the section
  (TRIME's temperature, the cache's lambda and theta, ...).

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
  """

  SECTION: ClassVar[str] = "eval_memory"
  kind: str = "none"
  long_mem_tokens: int = 0
  long_mem_grid: tuple[int, ...] = ()
  long_mem_span: str = "before_window"
  sweep_tokens: tuple[int, ...] = (
      0, 1024, 2048, 4096, 8192, 12288, 16384, 24576,
  )  # fmt: skip
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


@dataclasses.dataclass(frozen=True)
class Mesh:
  """``config.mesh``: the device mesh's axis sizes (-1: the rest)."""

  SECTION: ClassVar[str] = "mesh"
  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  # Data-parallel, and the axis a memory table's rows are split over.
  memory: int = 1

  def spec(self) -> dict[str, int]:
    """{'data': ..., 'fsdp': ..., 'tensor': ..., 'memory': ...}."""
    return dataclasses.asdict(self)


# The engine's sections every run reads, in the base config's order.
ENGINE = (Data, Model, Loss, Optim, Train, Eval, EvalMemory, Mesh)
# The keys at the top of the config.
TOP_KEYS = {"name": "vanilla", "seed": 0, "task": "lm"}


@dataclasses.dataclass(frozen=True)
class Settings:
  """Every section of a run, read once from its config.

  Attributes:
    name: the run's name (``config.name``).
    seed: its seed.
    task: what it learns from and how it is scored (lm, translation, mlm,
      classification).
    data, model, loss, optim, train, eval, eval_memory, mesh: the
      sections every run reads.
    sections: {settings class: its instance} of every declared section,
      the engine's, the tasks' and the methods' (``of``).
    raw: {section: {key: plain value}} of every section of the config as
      given, keys no class declares included (a config file may add some,
      e.g. ``translation.memory``; ``values``).
  """

  name: str
  seed: int
  task: str
  data: Data
  model: Model
  loss: Loss
  optim: Optim
  train: Train
  eval: Eval
  eval_memory: EvalMemory
  mesh: Mesh
  sections: Mapping[type, Any] = dataclasses.field(repr=False)
  raw: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=dict, repr=False
  )

  def of(self, cls: type[T]) -> T:
    """The instance of a declared settings class (a task's or a method's
    section: ``settings.of(Extrapolate)``)."""
    try:
      return self.sections[cls]
    except KeyError:
      raise KeyError(
          f"{cls.__name__} is not a declared settings class of this run"
      ) from None

  def values(self, section: str) -> dict[str, Any]:
    """{key: value} of one section: every class's keys (the engine's and
    the methods' keys of ``eval_memory``, say) and those a config file
    added that no class declares ({} for a section the config lacks)."""
    out = dict(self.raw.get(section, {}))
    for cls, instance in self.sections.items():
      if cls.SECTION == section:
        out.update(dataclasses.asdict(instance))
    return out

  def with_values(self, section: str, **values: Any) -> "Settings":
    """A copy with keys of one section set, whichever class declares each
    (``settings.with_values('eval_memory', datastore=..., ext_k=8)``).

    Raises:
      errors.ConfigError: a key no class of the section declares.
    """
    changes, left = [], dict(values)
    for cls, instance in self.sections.items():
      if cls.SECTION != section:
        continue
      own = {f.name for f in dataclasses.fields(cls)}
      mine = {k: left.pop(k) for k in list(left) if k in own}
      if mine:
        changes.append(dataclasses.replace(instance, **mine))
    if left:
      raise errors.ConfigError(
          f"{section} has no key {', '.join(sorted(left))}"
      )
    return self.replace(*changes)

  def replace(self, *changes: Any, **top: Any) -> "Settings":
    """A copy with sections replaced (``settings.replace(dataclasses.replace(
    settings.eval, batch_size=8))``) and top keys set (``seed=1``)."""
    sections = dict(self.sections)
    attrs = dict(top)
    for new in changes:
      sections[type(new)] = new
      if type(new) in ENGINE:
        attrs[new.SECTION] = new
    return dataclasses.replace(self, sections=sections, **attrs)


def read_all(config: Any, classes: Iterable[type]) -> Settings:
  """The ``Settings`` of a config: every class of ``classes`` read from
  its section."""
  absent = sorted({c.SECTION for c in classes if c.SECTION not in config})
  if absent:
    raise errors.ConfigError(
        f"the config has no section {', '.join(absent)}: build it with "
        "memjax.config.base_config() after extend.add of the method that "
        "declares it"
    )
  sections = {cls: read(cls, config[cls.SECTION]) for cls in classes}
  missing = [cls.__name__ for cls in ENGINE if cls not in sections]
  if missing:
    raise ValueError(f"the engine's sections must be read: {missing}")
  raw = {
      k: plain(v)
      for k, v in config.items()
      if isinstance(v, (ml_collections.ConfigDict, Mapping))
  }
  return Settings(
      name=str(config.name),
      seed=int(config.seed),
      task=str(config.get("task", "lm")),
      **{cls.SECTION: sections[cls] for cls in ENGINE},
      sections=sections,
      raw=raw,
  )
