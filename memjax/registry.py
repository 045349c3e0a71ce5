"""Extension points: one registry of named implementations per kind.

A method registers a name at its extension point, next to its
implementation; a config picks it by that name. Looking up a name that is
not registered raises ``errors.ConfigError`` naming the config key and the
registered names.

| registry | config key | value |
|---|---|---|
| ``ATTENTION`` | ``model.attention`` | an ``attention.AttentionKind`` module class |
| ``FEED_FORWARD`` | ``model.feed_forward`` | a Flax module class, ``ffn(x, deterministic=) -> y`` |
| ``MODEL_FAMILIES`` | ``model.family`` | ``build(model_config, *, vocab_size, dtype) -> module`` |
| ``OBJECTIVES`` | ``loss.name`` | ``make(loss_config, num_steps, seed) -> loss_fn`` |
| ``BATCHERS`` | ``data.batching`` | ``make(config, train_stream, cache_dir) -> batcher`` |
| ``EVAL_MEMORIES`` | ``eval_memory.kind`` | an ``evaluation.EvalMemory`` |
| ``MODES`` | ``--mode`` | a ``Mode``: ``'module:function'`` (imported when run), a line of help and the run kinds it takes |
| ``CONFIG_CHECKS`` | (all run) | ``check(config)`` raising ``ConfigError`` |
| ``TASKS`` | ``task`` | a ``task.Task``: data, vocabulary and evaluation |
| ``HOOKS`` | ``train.hooks`` | a ``hooks.StepHook`` subclass |
| ``OPTIMIZER_TRANSFORMS`` | ``optim.transform`` | ``make(optim_settings, schedule) -> optax transformation`` |
| ``SUM_REPORTS`` | (collected by evaluation) | a ``stats.SumReport`` |

Built-ins register themselves when their module is imported, and a registry
imports them on its first lookup, so callers never import them first (this
module imports none of them, so there is no import cycle). The engine's
built-in modules are listed below; the methods are found, not listed: every
package under ``memjax/methods/`` declares in its ``__init__.py``, without
importing anything,

* ``REGISTERS``: {registry name: modules that register into it}, imported
  when that registry is first read;
* ``MODES``: {mode: {'run': ``'module:function'``, 'help': one line,
  'kinds': the run kinds it takes (``RUN_KINDS``)}};
* ``CONFIG``: ``'module:function'`` adding the method's config keys
  (``memjax.config.base_config``).

Code outside memjax registers its own names the same way before the run
starts::

    from memjax import registry

    @registry.FEED_FORWARD.register("gated")
    class GatedFeedForward(nn.Module):
      ...

    registry.MODES.register(
        "mymode",
        registry.Mode("mypackage.modes:mymode", "what it does", ("lm",)),
    )
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import pkgutil
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

from memjax import errors

T = TypeVar("T")
_MISSING = object()


class Registry(Generic[T]):
  """Named implementations of one extension point.

  Attributes:
    what: what the entries are, for messages ('attention kind').
    config_key: the config key (or flag) that picks an entry.
  """

  def __init__(
      self,
      what: str,
      config_key: str,
      builtin_modules: Sequence[str] = (),
      *,
      name: str = "",
      check: Optional[Callable[[str, Any], None]] = None,
  ):
    """A registry whose built-ins register themselves in ``builtin_modules``.

    Args:
      what: what the entries are, for messages.
      config_key: the config key (or flag) that picks an entry.
      builtin_modules: engine modules imported on the first lookup, which
        register the built-in entries (the methods' modules follow).
      name: the registry's name in this module ('OBJECTIVES'), the key of
        the methods' ``REGISTERS`` ('' for a registry of one's own).
      check: ``check(name, value)`` raising TypeError for a value of the
        wrong kind, run at registration.
    """
    self.name = name
    self.what = what
    self.config_key = config_key
    self._builtin_modules = tuple(builtin_modules)
    self._check = check
    self._loaded = False
    self._entries: dict[str, T] = {}

  def register(
      self, name: str, value: Any = _MISSING, *, replace: bool = False
  ) -> Any:
    """Registers ``value`` under ``name``; without ``value``, a decorator.

    Args:
      name: the name configs use.
      value: the implementation.
      replace: replace an entry of the same name (the built-ins are
        registered first, so a built-in can be replaced).

    Returns:
      ``value`` (or, as a decorator, a function that registers and returns
      what it decorates).

    Raises:
      ValueError: ``name`` is taken and ``replace`` is False (two methods
        claiming one name is a bug, not a user error).
    """
    if value is _MISSING:

      def decorator(obj: T) -> T:
        self.register(name, obj, replace=replace)
        return obj

      return decorator
    if not isinstance(name, str) or not name:
      raise ValueError(f"a {self.what} name must be a non-empty string")
    if self._check is not None:
      self._check(name, value)
    if replace:
      self._load_builtins()
    if name in self._entries and self._entries[name] is value:
      return value  # A module imported twice (as a script and a module).
    if name in self._entries and not replace:
      raise ValueError(
          f"{self.what} {name!r} is already registered "
          f"({self._entries[name]!r}); pass replace=True to replace it"
      )
    self._entries[name] = value
    return value

  def remove(self, name: str) -> None:
    """Removes ``name`` (a no-op if it is not registered)."""
    self._entries.pop(name, None)

  def get(self, name: str) -> T:
    """The implementation registered under ``name``.

    Raises:
      errors.ConfigError: nothing is registered under ``name``; the message
        names the config key and the registered names.
    """
    self._load_builtins()
    if name not in self._entries:
      raise errors.ConfigError(
          f"unknown {self.config_key} {name!r}: no {self.what} of that name "
          f"is registered; registered: {', '.join(self.names())}"
      )
    return self._entries[name]

  def names(self) -> tuple[str, ...]:
    """The registered names, sorted."""
    self._load_builtins()
    return tuple(sorted(self._entries))

  def __contains__(self, name: object) -> bool:
    self._load_builtins()
    return name in self._entries

  def __repr__(self) -> str:
    return f"Registry({self.what!r}, {self.config_key!r})"

  def _load_builtins(self) -> None:
    if self._loaded:
      return
    # Set first: a built-in module may look names up while it is imported.
    self._loaded = True
    try:
      for module in self._builtin_modules:
        importlib.import_module(module)
      for method in methods() if self.name else ():
        if self.name == "MODES":
          for mode, declared in getattr(method, "MODES", {}).items():
            self.register(mode, declared)
        for module in getattr(method, "REGISTERS", {}).get(self.name, ()):
          importlib.import_module(module)
    except BaseException:
      self._loaded = False
      raise


# Where the methods are: every package in this folder is one. The registry
# finds them by looking, so nothing in the engine names one.
METHODS_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "methods"
)
_METHODS_PACKAGE = __name__.rpartition(".")[0] + ".methods"


@functools.cache
def methods() -> tuple[Any, ...]:
  """The method packages under ``memjax/methods/``, imported (their
  ``__init__`` modules declare what they register and import nothing)."""
  found = sorted(pkgutil.iter_modules([METHODS_DIR]), key=lambda i: i.name)
  return tuple(
      importlib.import_module(f"{_METHODS_PACKAGE}.{info.name}")
      for info in found
      if info.ispkg
  )


def method_config_sections() -> tuple[str, ...]:
  """The ``CONFIG`` targets (``'module:function'``) of the methods."""
  return tuple(m.CONFIG for m in methods() if getattr(m, "CONFIG", ""))


def _is_hook(name: str, value: Any) -> None:
  """Raises TypeError unless ``value`` subclasses ``hooks.StepHook`` (found
  by name: ``memjax.run.hooks`` imports this module)."""
  bases = getattr(value, "__mro__", ())
  if not any(
      f"{b.__module__}.{b.__qualname__}" == "memjax.run.hooks.StepHook"
      for b in bases
  ):
    raise TypeError(f"hook {name!r}: {value!r} is not a StepHook subclass")


# The kinds of run a mode can be given: a run's ``task``, and, for a mode
# that needs one model family, ``'<task>/<model.family>'``.
RUN_KINDS = {
    "lm": "decoder language model (task 'lm')",
    "translation": "encoder-decoder translation (task 'translation')",
    "mlm": "masked-LM encoder (task 'mlm')",
    "classification": "fine-tuned encoder classifier (task 'classification')",
}


def run_kind(config: Any) -> str:
  """``'<task>/<model.family>'`` of a config (task 'lm' by default)."""
  return f"{config.get('task', 'lm')}/{config.model.family}"


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
    run: ``'module:function'``, called as ``function(config, workdir)``
      (returns a results dict); the module is imported when the mode runs.
    help: what the mode does, in one line.
    kinds: the run kinds it takes (``RUN_KINDS`` keys, or
      ``'<task>/<model.family>'``); empty: every run.
    writes: names of the files the mode may leave in a workdir before the
      run trains there (an offline job's summary, a plan), so that training
      takes that workdir (``runfiles.check_workdir``).
  """

  run: str
  help: str = ""
  kinds: tuple[str, ...] = ()
  writes: tuple[str, ...] = ()

  def takes(self, kind: str) -> bool:
    """Whether a run of ``kind`` (``run_kind``) fits this mode."""
    task = kind.partition("/")[0]
    return not self.kinds or any(k in (task, kind) for k in self.kinds)

  def kinds_text(self) -> str:
    """The kinds in words, e.g. 'any run' or 'lm, translation'."""
    return ", ".join(self.kinds) if self.kinds else "any run"

  def check(self, name: str, config: Any) -> None:
    """Raises ``errors.ConfigError`` (one line naming the kinds the mode
    takes) for a run of another kind."""
    kind = run_kind(config)
    if not self.takes(kind):
      wanted = "; ".join(describe_kind(k) for k in self.kinds)
      raise errors.ConfigError(
          f"--mode={name} takes a run of kind {self.kinds_text()} ({wanted}); "
          f"this run is {kind} ({describe_kind(kind)}): pick another --mode "
          "(--mode=list shows each mode's kinds) or another --config"
      )


def as_mode(value: Any) -> Mode:
  """A ``Mode`` from a Mode, a ``'module:function'`` string, or a dict
  {'run', 'help', 'kinds', 'writes'} (how the methods declare theirs)."""
  if isinstance(value, Mode):
    return value
  if isinstance(value, str):
    return Mode(value)
  if isinstance(value, dict):
    return Mode(
        value["run"],
        value.get("help", ""),
        tuple(value.get("kinds", ())),
        tuple(value.get("writes", ())),
    )
  raise TypeError(f"a mode is a Mode, a 'module:function' or a dict: {value!r}")


class ModeRegistry(Registry[Mode]):
  """``MODES``: registers a ``Mode`` from what ``as_mode`` takes."""

  def files_before_training(self) -> frozenset[str]:
    """The file names any registered mode declares in ``Mode.writes``."""
    return frozenset(f for n in self.names() for f in self.get(n).writes)

  def register(
      self, name: str, value: Any = _MISSING, *, replace: bool = False
  ) -> Any:
    if value is _MISSING:
      return super().register(name, replace=replace)
    mode = as_mode(value)
    if self._entries.get(name) == mode:
      return self._entries[name]  # The same mode declared twice.
    return super().register(name, mode, replace=replace)

  def table(self) -> list[str]:
    """One line per mode: its name, the kinds it takes and its help."""
    names = self.names()
    width = max(len(n) for n in names)
    kinds = {n: self.get(n).kinds_text() for n in names}
    kwidth = max(len(k) for k in kinds.values())
    return [
        f"{n:<{width}}  {kinds[n]:<{kwidth}}  {self.get(n).help}" for n in names
    ]


ATTENTION: Registry[type] = Registry(
    "attention kind",
    "model.attention",
    ("memjax.models.attention",),
    name="ATTENTION",
)
FEED_FORWARD: Registry[type] = Registry(
    "feed-forward kind",
    "model.feed_forward",
    ("memjax.models.feed_forward",),
    name="FEED_FORWARD",
)
MODEL_FAMILIES: Registry[Callable[..., Any]] = Registry(
    "model family",
    "model.family",
    (
        "memjax.models.transformer",
        "memjax.models.seq2seq",
        "memjax.models.encoder",
    ),
    name="MODEL_FAMILIES",
)
OBJECTIVES: Registry[Callable[..., Any]] = Registry(
    "training objective", "loss.name", ("memjax.losses",), name="OBJECTIVES"
)
BATCHERS: Registry[Callable[..., Any]] = Registry(
    "batcher",
    "data.batching",
    (
        "memjax.data.batchers",
        "memjax.data.token_batching",
        "memjax.data.mlm",
        "memjax.data.glue",
    ),
    name="BATCHERS",
)
EVAL_MEMORIES: Registry[Any] = Registry(
    "evaluation memory",
    "eval_memory.kind",
    ("memjax.memory.evaluation",),
    name="EVAL_MEMORIES",
)
MODES: ModeRegistry = ModeRegistry(
    "mode", "--mode", ("memjax.modes",), name="MODES"
)
TASKS: Registry[Any] = Registry(
    "training task",
    "task",
    (
        "memjax.tasks.lm",
        "memjax.tasks.translation.task",
        "memjax.tasks.mlm",
        "memjax.tasks.classification",
    ),
    name="TASKS",
)
# Checks across config sections that one method needs (e.g. an objective
# that needs a kind of batch): ``validation.validate_config`` runs every
# registered check before anything is written.
CONFIG_CHECKS: Registry[Callable[[Any], None]] = Registry(
    "config check", "(every registered check runs)", name="CONFIG_CHECKS"
)
# Step hooks: ``hooks.StepHook`` subclasses the training loop runs every N
# updates (``memjax/run/hooks.py``).
HOOKS: Registry[type] = Registry(
    "step hook",
    "train.hooks",
    ("memjax.run.hooks",),
    name="HOOKS",
    check=_is_hook,
)
# Optimiser transformations that replace ``optim.optimizer`` for the base or
# a parameter group (``memjax/run/optim.py``).
OPTIMIZER_TRANSFORMS: Registry[Callable[..., Any]] = Registry(
    "optimiser transform",
    "optim.transform",
    ("memjax.run.optim",),
    name="OPTIMIZER_TRANSFORMS",
)
# Per-slot sums that modules sow during evaluation and how to report them
# (``memjax.models.stats.SumReport``), e.g. the reads of a memory layer's slots.
SUM_REPORTS: Registry[Any] = Registry(
    "sum report", "(every registered report is collected)", name="SUM_REPORTS"
)
