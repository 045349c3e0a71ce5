"""A run's settings, typed and frozen: one dataclass per config section.

The ConfigDict is the user's interface (``configs/*.py``, ``--config.*``
overrides, ``config.json``); ``memjax.build`` reads it once into these
dataclasses, and everything below takes them, or the few fields it needs.
Each class owns one section (``SECTION``) and declares its keys and
defaults: the engine's in ``sections``, each task's and each method's
beside its code. ``memjax.config.base_config`` is made from the classes'
defaults, so a key has one home.

``Settings`` holds every section of a run: the engine's as attributes
(``settings.data.seq_len``), a task's or a method's by its class
(``settings.of(Extrapolate).ratios``). That is the one way code reads a
setting. Keys that moved to another section are read through one
translation table (``translate_tree``, below).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Iterable, Mapping, Optional, Sequence, TypeVar

import ml_collections

from memjax import errors
from memjax import extend
from memjax.settings import sections
from memjax.settings.sections import Data
from memjax.settings.sections import Datastore
from memjax.settings.sections import ENGINE
from memjax.settings.sections import Eval
from memjax.settings.sections import EvalMemory
from memjax.settings.sections import frozen_dict
from memjax.settings.sections import Loss
from memjax.settings.sections import Mesh
from memjax.settings.sections import Model
from memjax.settings.sections import Optim
from memjax.settings.sections import TOP_KEYS
from memjax.settings.sections import Train

__all__ = [
    "Data",
    "Datastore",
    "ENGINE",
    "Eval",
    "EvalMemory",
    "Loss",
    "Mesh",
    "Model",
    "Optim",
    "Settings",
    "TOP_KEYS",
    "check_ranges",
    "Train",
    "frozen_dict",
    "layers_from_the_start",
    "plain",
    "read",
    "read_all",
    "replaced",
    "section_defaults",
    "settled_model",
    "settled_options",
    "to_json",
]

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
  """The instance of ``cls`` that a config section holds.

  Raises:
    errors.ConfigError: the section holds a key ``cls`` does not declare.
  """
  names = _declared(cls, section)
  return cls(**{n: plain(section[n]) for n in names if n in section})


def replaced(instance: T, **changes: Any) -> T:
  """A copy of a section's settings with keys set
  (``replaced(settings.train, num_steps=8)``).

  Raises:
    errors.ConfigError: a key the section does not declare.
  """
  _declared(instance, changes)
  return dataclasses.replace(instance, **changes)


def _declared(cls: Any, keys: Any) -> list[str]:
  """The keys ``cls`` (a settings class or instance) declares.

  Raises:
    errors.ConfigError: one of ``keys`` is not among them.
  """
  names = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(keys) - set(names))
  if unknown:
    raise errors.ConfigError(
        f"{cls.SECTION} has no key {', '.join(unknown)}; its keys: "
        f"{', '.join(names)}"
    )
  return names


def section_defaults(cls: type) -> dict[str, Any]:
  """{key: default} of a settings class, in declaration order."""
  out = {}
  for f in dataclasses.fields(cls):
    if f.default is not dataclasses.MISSING:
      out[f.name] = f.default
    else:
      out[f.name] = f.default_factory()  # type: ignore[misc]
  return out


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

  def of(self, cls: type[T]) -> T:
    """The instance of a declared settings class (a task's or a method's
    section: ``settings.of(Extrapolate)``)."""
    try:
      return self.sections[cls]
    except KeyError:
      raise KeyError(
          f"{cls.__name__} is not a declared settings class of this run"
      ) from None

  def task_section(self) -> Optional[Any]:
    """The settings of the task's own section (``translation``, ``mlm``,
    ...), None for a task without one (``lm``)."""
    for cls, instance in self.sections.items():
      if cls.SECTION == self.task:
        return instance
    return None

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


def _in_range(rule: str, v: Any) -> bool:
  number = not isinstance(v, bool) and isinstance(v, (int, float))
  if rule == sections.POSITIVE:
    return isinstance(v, int) and v >= 1
  if rule == sections.NON_NEGATIVE:
    return isinstance(v, int) and v >= 0
  if rule == sections.NON_NEGATIVE_REAL:
    return number and v >= 0
  if rule == sections.DROPOUT:
    return number and 0 <= v < 1
  if rule == sections.STEP_SPAN:
    steps = tuple(v or ())
    positive = all(isinstance(n, int) and n >= 1 for n in steps)
    return not steps or (len(steps) == 2 and positive)
  raise ValueError(f"unknown range {rule!r}")


def check_ranges(s: Settings) -> None:
  """Checks every key that declares a range (``sections.ranged``).

  Raises:
    errors.ConfigError: naming the key and its range.
  """
  for instance in s.sections.values():
    for f in dataclasses.fields(instance):
      rule = f.metadata.get("range")
      v = getattr(instance, f.name)
      if rule and not _in_range(rule, v):
        raise errors.ConfigError(
            f"{instance.SECTION}.{f.name} must be {rule}, got {v!r}"
        )


def check_owners(classes: Iterable[type]) -> None:
  """Raises ValueError (a bug) when two classes declare one section."""
  owners: dict[str, type] = {}
  for cls in classes:
    if cls.SECTION in owners and owners[cls.SECTION] is not cls:
      raise ValueError(
          f"section {cls.SECTION} is declared by {owners[cls.SECTION]} and "
          f"{cls}: a section has one owner"
      )
    owners[cls.SECTION] = cls


def read_all(
    config: Any,
    classes: Iterable[type],
    renames: Optional[Mapping[str, str]] = None,
) -> Settings:
  """The ``Settings`` of a config: every class of ``classes`` read from
  its section, after the keys that moved are read at their new place
  (``translate_tree``, which names each on one line).

  Args:
    config: the ConfigDict (or nested dicts).
    classes: the declared settings classes, one per section.
    renames: old dotted key -> new (``extend.Parts.renames``).

  Raises:
    errors.ConfigError: a section is absent, or holds a key its class does
      not declare.
  """
  classes = tuple(classes)
  check_owners(classes)
  tree = translate_tree(plain(config), renames or {}, notice=True)
  absent = sorted({c.SECTION for c in classes if c.SECTION not in tree})
  if absent:
    raise errors.ConfigError(
        f"the config has no section {', '.join(absent)}: build it with "
        "memjax.config.base_config() after extend.add of the method that "
        "declares it"
    )
  sections = {cls: read(cls, tree[cls.SECTION]) for cls in classes}
  missing = [cls.__name__ for cls in ENGINE if cls not in sections]
  if missing:
    raise ValueError(f"the engine's sections must be read: {missing}")
  return Settings(
      name=str(tree["name"]),
      seed=int(tree["seed"]),
      task=str(tree.get("task", "lm")),
      **{cls.SECTION: sections[cls] for cls in ENGINE},
      sections=sections,
  )


def layers_from_the_start(layers: Any, num_layers: int) -> tuple[int, ...]:
  """``model.feed_forward_layers`` with each negative number counted from
  the end (-1: layer ``num_layers``); the others as given."""
  return tuple(int(i) if i >= 0 else num_layers + 1 + int(i) for i in layers)


# Keys that moved: one table, applied wherever a config is read.
# Methods declare the keys that moved into their sections
# (``extend.Method.renames``: ``{'loss.memory': 'trime.memory'}``; a key that
# held a whole dict maps its keys: ``{'data.marge': 'marge'}``). Config
# files, ``--config.*`` command-line overrides and the ``config.json`` of runs
# and exports written with the old keys read through this table: a config
# file's or a command line's old key is named on one line (once per process);
# a saved run's is read silently.
Renames = Mapping[str, str]

_NOTED: set[str] = set()


def _notice(old: str, new: str) -> None:
  """One line per moved key and process, on stderr."""
  if old not in _NOTED:
    _NOTED.add(old)
    print(
        f"memjax: note: config key {old} moved to {new}; read there",
        file=sys.stderr,
    )


def new_key(key: str, renames: Renames) -> Optional[str]:
  """The new dotted key of ``key`` (itself or below a moved key), or None."""
  for old, new in renames.items():
    if key == old:
      return new
    if key.startswith(old + "."):
      return new + key[len(old) :]
  return None


def _pop(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
  """(found, value) of a dotted key of ``tree``, removed from it."""
  *parents, last = key.split(".")
  node: Any = tree
  for p in parents:
    if not isinstance(node, Mapping) or p not in node:
      return False, None
    node = node[p]
  if not isinstance(node, dict) or last not in node:
    return False, None
  return True, node.pop(last)


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
  """Sets a dotted key of ``tree``; a dict merges into a dict already
  there (a whole moved section over the new section's defaults)."""
  *parents, last = key.split(".")
  node = tree
  for p in parents:
    node = node.setdefault(p, {})
  if isinstance(value, Mapping) and isinstance(node.get(last), dict):
    node[last].update(value)
  else:
    node[last] = value


def translate_tree(
    tree: Mapping[str, Any], renames: Renames, *, notice: bool = False
) -> dict[str, Any]:
  """A config as nested dicts (``config.json``'s, or a ConfigDict's
  ``to_dict()``) with every moved key at its new place.

  Args:
    tree: the config.
    renames: old dotted key -> new.
    notice: name each moved key found on stderr (config files and command
      lines; a saved run is read silently).
  """
  out = _copy(tree)
  for old, new in renames.items():
    found, value = _pop(out, old)
    if found:
      if notice:
        _notice(old, new)
      _put(out, new, value)
  return out


def _copy(tree: Any) -> Any:
  if isinstance(tree, Mapping):
    return {k: _copy(v) for k, v in tree.items()}
  return tree


def translate_argv(
    argv: Sequence[str], renames: Renames, flag: str = "config"
) -> list[str]:
  """A command line with ``--config.OLD`` overrides rewritten to the new
  keys (before the flags are parsed: ml_collections refuses a key its
  config lacks), each named on one line."""
  prefix = f"--{flag}."
  out = []
  for arg in argv:
    if arg.startswith(prefix):
      key, eq, value = arg[len(prefix) :].partition("=")
      new = new_key(key, renames)
      if new is not None:
        _notice(key, new)
        arg = f"{prefix}{new}{eq}{value}"
    out.append(arg)
  return out


# ----------------------------------------------------------------------------
# The options of the model's kinds, settled
# ----------------------------------------------------------------------------

# The model's kinds with options: (kind key, options key, what a kind is).
KIND_SLOTS = (
    ("attention", "attention_options", "attention kind"),
    ("feed_forward", "feed_forward_options", "feed-forward kind"),
)
# Options every feed-forward kind is given, read by the engine: the kind of
# the layers outside ``model.feed_forward_layers``.
ENGINE_OPTIONS = ("base",)


def _modules(slot: str, parts: extend.Parts) -> dict[str, type]:
  """{kind name: its module class} of ``slot``."""
  lookup = getattr(parts, slot)
  if slot == "attention":
    return dict(lookup.items())
  return {name: kind.module for name, kind in lookup.items()}


def kind_defaults(
    slot: str, name: str, parts: extend.Parts
) -> dict[str, Any] | None:
  """{option: default} of the kind ``name`` of ``slot`` ('attention' or
  'feed_forward'): its options dataclass's (``extend.option_defaults``);
  None for no kind of that name, or one of the older form."""
  modules = _modules(slot, parts)
  return extend.option_defaults(modules[name]) if name in modules else None


def settled_options(
    slot: str,
    name: str,
    given: Mapping[str, Any] | None,
    parts: extend.Parts,
) -> dict[str, Any]:
  """The options of the kind ``name``: ``given`` with every option the
  kind declares at its default where unset, less the options of other
  kinds left at their defaults (those a kind picked before filled in)."""
  defaults = kind_defaults(slot, name, parts)
  module = _modules(slot, parts).get(name)
  if defaults is None and module is not None:  # The older form: its fields.
    fields = {f.name for f in dataclasses.fields(module)}
  else:
    fields = set(defaults or ())
  others = [
      extend.option_defaults(m) or {} for m in _modules(slot, parts).values()
  ]
  out = {}
  for k, v in plain(dict(given or {})).items():
    own = module is None or k in fields or k in ENGINE_OPTIONS
    if own or not any(k in d and d[k] == v for d in others):
      out[k] = v
  out.update({k: v for k, v in (defaults or {}).items() if k not in out})
  return out


def settled_model(model: Model, parts: extend.Parts) -> Model:
  """The model settings with every option of its kinds (``settled_options``).

  Raises:
    errors.ConfigError: an unknown kind, or an option its kind does not
      declare (one line naming the ones it does).
  """
  changes = {}
  for slot, key, what in KIND_SLOTS:
    name = getattr(model, slot)
    getattr(parts, slot).get(name)  # An unknown kind: its own message.
    options = settled_options(slot, name, getattr(model, key), parts)
    defaults = kind_defaults(slot, name, parts)
    if defaults is not None:
      own = {k: v for k, v in options.items() if k not in ENGINE_OPTIONS}
      extend.check_options(own, defaults, f"model.{key} of {what} {name!r}")
    changes[key] = options
  return dataclasses.replace(model, **changes)


def to_json(config: ml_collections.ConfigDict) -> str:
  """The text of a run's ``config.json``."""
  return config.to_json_best_effort(indent=2, sort_keys=True)
