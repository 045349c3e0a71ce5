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
translation table (``renames``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Optional, TypeVar

import ml_collections

from memjax import errors
from memjax.settings import renames as renames_lib
from memjax.settings import sections
from memjax.settings.sections import Data
from memjax.settings.sections import Datastore
from memjax.settings.sections import ENGINE
from memjax.settings.sections import Eval
from memjax.settings.sections import EvalMemory
from memjax.settings.sections import frozen_dict
from memjax.settings.sections import layers_from_the_start
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
  (``renames.translate_tree``, which names each on one line).

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
  tree = renames_lib.translate_tree(plain(config), renames or {}, notice=True)
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
