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
| ``MODES`` | ``--mode`` | ``'module:function'``, imported when run |
| ``CONFIG_CHECKS`` | (all run) | ``check(config)`` raising ``ConfigError`` |
| ``TASKS`` | ``task`` | a ``task.Task``: data, vocabulary and evaluation |

Each module that holds built-in implementations registers them when it is
imported; a registry imports its built-in modules on its first lookup, so
callers never need to import them first (and this module imports none of
them, so there is no import cycle). Code outside memjax registers its own
names the same way before the run starts::

    from memjax import registry

    @registry.FEED_FORWARD.register("gated")
    class GatedFeedForward(nn.Module):
      ...

    registry.MODES.register("mymode", "mypackage.modes:mymode")
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, Sequence, TypeVar

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
      self, what: str, config_key: str, builtin_modules: Sequence[str] = ()
  ):
    """A registry whose built-ins register themselves in ``builtin_modules``.

    Args:
      what: what the entries are, for messages.
      config_key: the config key (or flag) that picks an entry.
      builtin_modules: modules imported on the first lookup, which register
        the built-in entries.
    """
    self.what = what
    self.config_key = config_key
    self._builtin_modules = tuple(builtin_modules)
    self._loaded = not self._builtin_modules
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
    if replace:
      self._load_builtins()
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
    except BaseException:
      self._loaded = False
      raise


ATTENTION: Registry[type] = Registry(
    "attention kind",
    "model.attention",
    (
        "memjax.models.attention",
        "memjax.models.relative",
        "memjax.models.lamemo",
    ),
)
FEED_FORWARD: Registry[type] = Registry(
    "feed-forward kind",
    "model.feed_forward",
    ("memjax.models.feed_forward", "memjax.models.pkm"),
)
MODEL_FAMILIES: Registry[Callable[..., Any]] = Registry(
    "model family",
    "model.family",
    (
        "memjax.models.transformer",
        "memjax.models.seq2seq",
        "memjax.models.marge",
        "memjax.models.encoder",
    ),
)
OBJECTIVES: Registry[Callable[..., Any]] = Registry(
    "training objective",
    "loss.name",
    ("memjax.losses", "memjax.translation.trime_mt"),
)
BATCHERS: Registry[Callable[..., Any]] = Registry(
    "batcher",
    "data.batching",
    (
        "memjax.data.batchers",
        "memjax.data.packing",
        "memjax.data.token_batching",
        "memjax.memory.marge",
        "memjax.data.mlm",
        "memjax.data.glue",
        "memjax.translation.trime_mt",
    ),
)
EVAL_MEMORIES: Registry[Any] = Registry(
    "evaluation memory",
    "eval_memory.kind",
    (
        "memjax.memory.evaluation",
        "memjax.memory.trime",
        "memjax.memory.cache",
        "memjax.memory.external",
    ),
)
MODES: Registry[str] = Registry("mode", "--mode", ("memjax.modes",))
TASKS: Registry[Any] = Registry(
    "training task",
    "task",
    (
        "memjax.lm_task",
        "memjax.translation.task",
        "memjax.mlm_task",
        "memjax.classification_task",
    ),
)
# Checks across config sections that one method needs (e.g. an objective
# that needs a kind of batch): ``validation.validate_config`` runs every
# registered check before anything is written.
CONFIG_CHECKS: Registry[Callable[[Any], None]] = Registry(
    "config check", "(every registered check runs)", ("memjax.losses",)
)
