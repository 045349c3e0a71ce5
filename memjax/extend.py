"""What a method adds to memjax: one typed spec per method.

A method lives in ``memjax/methods/<name>/`` and its package exports one
``Method``, built from real imports, that lists every part it adds, under
the names configs pick them by::

    METHOD = extend.Method(
        name="trime",
        objectives={"trime": objective.make_trime_loss},
        eval_memories={"trime": in_batch.TrimeMemory()},
        batchers={"bm25": extend.Batcher(packing.bm25_batcher)},
        modes={"pack": extend.Mode(packing.pack, "pack the corpus ...",
                                   kinds=("lm",))},
        settings=(config.Trime, config.Pack),
    )

The engine's own parts are one more spec (``memjax.catalog.ENGINE``), and
``memjax.build.parts`` turns the specs into lookups (``Parts``) in one place:
it finds the methods by looking in ``memjax/methods/``, so the engine
names none. Code outside memjax builds a ``Method`` the same way and
passes it to ``add`` before the run is built (a config file may do it);
``docs/extending.md`` has a whole one.

| field | config key | what a name gives |
|---|---|---|
| ``attention`` | ``model.attention`` | an ``models.attention.AttentionKind`` class |
| ``feed_forward`` | ``model.feed_forward`` | a ``FeedForward`` |
| ``families`` | ``model.family`` | a ``Family`` |
| ``objectives`` | ``loss.name`` | ``make(settings, num_steps) -> loss_fn`` |
| ``batchers`` | ``data.batching`` | a ``Batcher`` |
| ``eval_memories`` | ``eval_memory.kind`` | a ``memory.evaluation.EvalMemory`` |
| ``hooks`` | ``train.hooks`` | a ``run.hooks.StepHook`` class |
| ``optimizer_transforms`` | ``optim.transform`` | ``make(group, schedule) -> optax transformation`` |
| ``sum_reports`` | (every one is collected) | a ``models.variables.SumReport`` |
| ``tasks`` | ``task`` | a ``tasks.base.Task`` class, built with the run's settings |
| ``modes`` | ``--mode`` | a ``Mode`` |
| ``checks`` | (every one runs) | ``check(settings)`` raising ``errors.ConfigError`` |
| ``flops`` | (every one is summed) | ``flops(settings, FlopsShape) -> {term: FLOPs per token}`` |
| ``settings`` | its sections | frozen dataclasses, one per section it owns: keys, defaults, types |
| ``renames`` | (one table) | old dotted key -> new, for keys that moved into its sections |

This module holds the types only and imports nothing of the engine's: the
parts are typed ``Any`` here and checked where they are used.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generic, Iterator, Mapping, Sequence, TypeVar

from memjax import errors

T = TypeVar("T")

# The kinds of run a mode can be given: a run's ``task``, and, for a mode
# that needs one model family, ``'<task>/<model.family>'``.
RUN_KINDS = {
    "lm": "decoder language model (task 'lm')",
    "translation": "encoder-decoder translation (task 'translation')",
    "mlm": "masked-LM encoder (task 'mlm')",
    "classification": "fine-tuned encoder classifier (task 'classification')",
}


def describe_kind(kind: str) -> str:
  """A run kind in words ('lm/marge' -> 'decoder language model (task
  'lm') of model.family 'marge'')."""
  task, _, family = kind.partition("/")
  text = RUN_KINDS.get(task, f"task {task!r}")
  return f"{text} of model.family {family!r}" if family else text


@dataclasses.dataclass(frozen=True)
class Mode:
  """One ``--mode``.

  Attributes:
    run: ``run(built) -> results dict``, given the run built from the
      config (``memjax.run.spec.Run``).
    help: what the mode does, in one line.
    kinds: the run kinds it takes (``RUN_KINDS`` keys, or
      ``'<task>/<model.family>'``); empty: every run.
    writes: names of the files the mode may leave in a workdir before the
      run trains there (an offline job's summary, a plan), so that
      training takes that workdir.
    before_jax: ``before_jax(settings)``, run before JAX starts its
      backends (``--mode=plan`` sets the number of fake devices).
    training: the mode trains in its workdir (which must then hold a run
      or nothing else).
    outputs: glob patterns, relative to the workdir, of the files the mode
      writes with the default settings (each matches at least one file
      after a run; the mode matrix test reads every match back).
    shape_only: the mode needs a model's shape, not its weights (taken
      from a pretrained folder's config.json: ``pretrained.sizes``).
  """

  run: Callable[[Any], dict[str, Any]]
  help: str = ""
  kinds: tuple[str, ...] = ()
  writes: tuple[str, ...] = ()
  before_jax: Callable[[Any], None] | None = None
  training: bool = False
  outputs: tuple[str, ...] = ()
  shape_only: bool = False

  def takes(self, kind: str) -> bool:
    """Whether a run of ``kind`` ('<task>/<model.family>') fits."""
    task = kind.partition("/")[0]
    return not self.kinds or any(k in (task, kind) for k in self.kinds)

  def kinds_text(self) -> str:
    """The kinds in words, e.g. 'any run' or 'lm, translation'."""
    return ", ".join(self.kinds) if self.kinds else "any run"

  def check(self, name: str, kind: str) -> None:
    """Raises ``errors.ConfigError`` (one line naming the kinds the mode
    takes) for a run of another kind."""
    if not self.takes(kind):
      wanted = "; ".join(describe_kind(k) for k in self.kinds)
      raise errors.ConfigError(
          f"--mode={name} takes a run of kind {self.kinds_text()} ({wanted}); "
          f"this run is {kind} ({describe_kind(kind)}): pick another --mode "
          "(--mode=list shows each mode's kinds) or another --config"
      )


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """The options of a kind that takes none."""


def kind_options(module: type) -> Any:
  """The default options of a kind: its module's ``options`` field's
  default, an instance of the kind's options dataclass (frozen, typed,
  one docstring line per option), declared once beside the kind; ``None``
  for a module without that field, whose own other fields are its options
  (the older form, still taken from kinds defined outside memjax)."""
  for f in dataclasses.fields(module):
    if f.name == "options":
      return f.default
  return None


def option_defaults(module: type) -> dict[str, Any] | None:
  """{option: default} of a kind's options (``kind_options``), in
  declaration order; None for a kind of the older form."""
  options = kind_options(module)
  if options is None:
    return None
  return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


def make_options(
    module: type, given: Mapping[str, Any] | None, where: str
) -> Any:
  """The kind's options object: its defaults with ``given`` set.

  Args:
    module: the kind's module class (one with an ``options`` field).
    given: {option: value} (a config's options section), or None.
    where: the config key and the kind, for messages
      ("model.feed_forward_options of feed-forward kind 'pkm'").

  Raises:
    errors.ConfigError: an option the kind does not declare, in one line
      naming the ones it does.
  """
  defaults = kind_options(module)
  given = dict(given or {})
  check_options(given, option_defaults(module) or {}, where)
  return dataclasses.replace(defaults, **given)


def check_options(
    given: Mapping[str, Any], defaults: Mapping[str, Any], where: str
) -> None:
  """Raises ``errors.ConfigError`` for a key of ``given`` not in
  ``defaults`` (the kind's options), naming them."""
  unknown = sorted(set(given) - set(defaults))
  if unknown:
    key, _, kind = where.partition(" of ")
    raise errors.ConfigError(
        f"{key} has {', '.join(unknown)}, which {kind} does not take; its "
        f"options: {', '.join(defaults) or 'none'}"
    )


@dataclasses.dataclass(frozen=True)
class FeedForward:
  """A feed-forward kind: the block's position-wise sub-layer.

  Its options (``model.feed_forward_options``) are one frozen dataclass,
  declared beside the kind: the module's ``options`` field, whose default
  gives every option's (``kind_options``; ``options`` here). A config
  that picks the kind holds every option at its default
  (``memjax.config.settle_options``), and a run's signature only those
  set to another value.

  Attributes:
    module: the Flax module class, built with ``d_model``, ``d_ff``,
      ``dropout_rate``, ``dtype`` and ``options``, and called as
      ``ffn(y [B, T, D], deterministic=...) -> [B, T, D]``.
    takes_mask: it is also given the padding mask (``mask=``, [B, T] bool)
      where a model has one.
    state_collections: the mutable collections it keeps across training
      steps (a BatchNorm's 'batch_stats'), carried in the train state.
    runtime_options: options that change how, not what, it computes: left
      out of the model's signature, so a run may be restored with others.
    takes_activation: it takes ``model.activation``.
    check: ``check(model settings)`` raising ``errors.ConfigError``.
    shared_params: ``shared_params(options, d_model) -> {name: (initializer,
      shape, logical axes)}``: parameters that every layer of the kind
      reads (one memory table for several layers). A family that supports
      them (``block_stack.BlockStack.shared_params``) creates them once, under
      ``ffn_shared``, and calls the kind with ``shared={name: array}``;
      an empty mapping: none.
  """

  module: type
  takes_mask: bool = False
  state_collections: tuple[str, ...] = ()
  runtime_options: tuple[str, ...] = ()
  takes_activation: bool = False
  check: Callable[[Any], None] | None = None
  shared_params: Callable[[Any, int], Any] | None = None

  @property
  def options(self) -> Any:
    """The kind's default options (``kind_options``), or None."""
    return kind_options(self.module)


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family.

  Attributes:
    build: ``build(model settings, vocab_size, parts) -> flax module``,
      the model a ``config.model`` describes (its sub-layers looked up in
      ``parts``).
    extra_inputs: batch arrays the model takes as keyword arguments
      besides inputs and targets (the encoder-decoder's 'source').
    state_collections: mutable collections the family itself keeps.
    refuses_attention: ``refuses_attention(name, kind) -> why | None``:
      why the family does not take the attention kind ``name`` (its class
      ``kind``), in words, or None where it applies it. None: it applies
      every kind.
  """

  build: Callable[..., Any]
  extra_inputs: tuple[str, ...] = ()
  state_collections: tuple[str, ...] = ()
  refuses_attention: Callable[[str, type], str | None] | None = None

  def check_attention(self, family: str, name: str, kind: type) -> None:
    """Refuses, in one line, an attention kind the family does not take.

    Raises:
      errors.ConfigError: naming the family, the kind and why.
    """
    why = self.refuses_attention and self.refuses_attention(name, kind)
    if why:
      raise errors.ConfigError(
          f"model.family {family!r} does not take model.attention "
          f"{name!r}: {why}"
      )


@dataclasses.dataclass(frozen=True)
class Batcher:
  """A training batcher.

  Attributes:
    make: ``make(settings, train, cache_dir) -> batcher`` with the run's
      settings, the training data (a ``data.tasks.TokenStream`` or the
      task's) and the cache directory; ``batcher.batch(step)`` is a pure
      function of the step.
    shapes: ``shapes(settings, devices) -> {name: (shape, dtype name)}``,
      the arrays of a batch known from the settings alone (``--mode=plan``
      compiles the step for them without data); None: not plannable.
  """

  make: Callable[..., Any]
  shapes: Callable[..., Any] | None = None


@dataclasses.dataclass(frozen=True)
class FlopsShape:
  """What a ``Method.flops`` term is given besides the settings.

  Attributes:
    seq_len: positions per row of the batch (T).
    rows: rows of one micro-batch (all devices together): work done once
      per row or once per step is divided over ``rows * seq_len`` tokens.
    num_params: the model's parameters (N).
    softmax_params: those of its (adaptive) embedding and softmax.
    projection_params: those of the adaptive embedding's projections
      (part of ``softmax_params``; used at the input and the output).
    vocab_size: V.
  """

  seq_len: int
  rows: int
  num_params: int = 0
  softmax_params: int = 0
  projection_params: int = 0
  vocab_size: int = 0


@dataclasses.dataclass(frozen=True)
class Method:
  """Everything a method adds (see the module docstring for each field).

  Attributes:
    name: the method's name (its folder's).
    builds_on: the methods whose parts it uses (its paper builds on
      theirs).
    defaults: new defaults it gives keys of other sections
      ({'eval_memory.sweep_kinds': ('trime', 'cache')}).
    renames: keys that moved into its sections, old dotted key -> new
      ({'trime.memory': 'trime.memory'}; a key that held a whole dict maps
      its keys: {'marge': 'marge'}): configs, command lines and
      saved runs written with the old keys still read
      (``memjax.settings.translate_tree``).
    flops: ``flops(settings, FlopsShape) -> {term: FLOPs per token}``,
      what a run using the method's parts computes per token, forward and
      backward, beyond ``--mode=plan``'s formula ``6 N + 12 n_layer T
      d_attn`` (negative where the formula counts more, e.g. parameters
      read for fewer than every token); ``{}`` for a run that does not use
      them. With ``model.remat`` the plan adds a third of each term (the
      forward pass recomputed).
  """

  name: str
  attention: Mapping[str, type] = dataclasses.field(default_factory=dict)
  feed_forward: Mapping[str, FeedForward] = dataclasses.field(
      default_factory=dict
  )
  families: Mapping[str, Family] = dataclasses.field(default_factory=dict)
  objectives: Mapping[str, Callable[..., Any]] = dataclasses.field(
      default_factory=dict
  )
  batchers: Mapping[str, Batcher] = dataclasses.field(default_factory=dict)
  eval_memories: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  hooks: Mapping[str, type] = dataclasses.field(default_factory=dict)
  optimizer_transforms: Mapping[str, Callable[..., Any]] = dataclasses.field(
      default_factory=dict
  )
  sum_reports: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  tasks: Mapping[str, type] = dataclasses.field(default_factory=dict)
  modes: Mapping[str, Mode] = dataclasses.field(default_factory=dict)
  checks: tuple[Callable[[Any], None], ...] = ()
  flops: tuple[Callable[[Any, FlopsShape], Mapping[str, float]], ...] = ()
  settings: tuple[type, ...] = ()
  defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
  builds_on: tuple[str, ...] = ()


class Lookup(Generic[T]):
  """The parts of one kind, by name (immutable).

  Attributes:
    what: what the entries are, for messages ('attention kind').
    key: the config key (or flag) that names one ('model.attention').
  """

  def __init__(self, what: str, key: str, entries: Mapping[str, T]):
    self.what = what
    self.key = key
    self._entries = dict(entries)

  def get(self, name: str) -> T:
    """The part named ``name``.

    Raises:
      errors.ConfigError: none of that name; the message names the config
        key and the names there are.
    """
    if name not in self._entries:
      raise errors.ConfigError(
          f"unknown {self.key} {name!r}: no {self.what} of that name "
          f"is declared; there are: {', '.join(self.names())}"
      )
    return self._entries[name]

  def names(self) -> tuple[str, ...]:
    """The names, sorted."""
    return tuple(sorted(self._entries))

  def items(self) -> Iterator[tuple[str, T]]:
    """(name, part) pairs, by name."""
    return ((n, self._entries[n]) for n in self.names())

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __repr__(self) -> str:
    return f"Lookup({self.what!r}, {len(self._entries)} entries)"


# Method field -> (what an entry is, the config key that names one).
KINDS = {
    "attention": ("attention kind", "model.attention"),
    "feed_forward": ("feed-forward kind", "model.feed_forward"),
    "families": ("model family", "model.family"),
    "objectives": ("training objective", "loss.name"),
    "batchers": ("batcher", "data.batching"),
    "eval_memories": ("evaluation memory", "eval_memory.kind"),
    "hooks": ("step hook", "train.hooks"),
    "optimizer_transforms": ("optimiser transform", "optim.transform"),
    "sum_reports": ("sum report", "(every report is collected)"),
    "tasks": ("training task", "task"),
    "modes": ("mode", "--mode"),
}


class Parts:
  """Every part of the given methods, by kind and name.

  ``parts.attention.get('xl')``, ``parts.modes.names()``; ``checks``,
  ``flops`` and ``settings`` are the methods' in order, ``defaults`` their
  defaults, ``renames`` the one table of keys that moved.
  """

  attention: Lookup[type]
  feed_forward: Lookup[FeedForward]
  families: Lookup[Family]
  objectives: Lookup[Callable[..., Any]]
  batchers: Lookup[Batcher]
  eval_memories: Lookup[Any]
  hooks: Lookup[type]
  optimizer_transforms: Lookup[Callable[..., Any]]
  sum_reports: Lookup[Any]
  tasks: Lookup[type]
  modes: Lookup[Mode]

  def __init__(self, methods: Sequence[Method]):
    """Merges the methods' parts.

    Raises:
      ValueError: two methods declare one name of a kind, or one settings
        key (a bug, not a user error).
    """
    self.methods = tuple(methods)
    for field, (what, key) in KINDS.items():
      entries: dict[str, Any] = {}
      for m in methods:
        for name, part in getattr(m, field).items():
          if name in entries:
            raise ValueError(
                f"{what} {name!r} is declared twice (method {m.name!r})"
            )
          entries[name] = part
      setattr(self, field, Lookup(what, key, entries))
    self.checks = tuple(c for m in methods for c in m.checks)
    self.flops = tuple(f for m in methods for f in m.flops)
    self.settings = tuple(s for m in methods for s in m.settings)
    self.defaults = {k: v for m in methods for k, v in m.defaults.items()}
    self.renames = {k: v for m in methods for k, v in m.renames.items()}

  def modes_table(self) -> list[str]:
    """One line per mode: its name, the kinds it takes and its help."""
    names = self.modes.names()
    width = max(len(n) for n in names)
    kinds = {n: self.modes.get(n).kinds_text() for n in names}
    kwidth = max(len(k) for k in kinds.values())
    return [
        f"{n:<{width}}  {kinds[n]:<{kwidth}}  {self.modes.get(n).help}"
        for n in names
    ]

  def files_before_training(self) -> frozenset[str]:
    """The file names any mode declares in ``Mode.writes``."""
    return frozenset(f for _, m in self.modes.items() for f in m.writes)


_ADDED: list[Method] = []


def add(method: Method) -> Method:
  """Adds a method defined outside memjax (before its run is built); adding
  the same spec again does nothing. Returns ``method``."""
  if not isinstance(method, Method):
    raise TypeError(f"extend.add takes an extend.Method, got {method!r}")
  if method not in _ADDED:
    if any(m.name == method.name for m in _ADDED):
      raise ValueError(f"a method named {method.name!r} was added already")
    _ADDED.append(method)
  return method


def remove(name: str) -> None:
  """Removes the added method ``name`` (a no-op if there is none)."""
  _ADDED[:] = [m for m in _ADDED if m.name != name]


def added() -> tuple[Method, ...]:
  """The methods added from outside memjax, in the order they were added."""
  return tuple(_ADDED)
