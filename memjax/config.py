"""The experiment configuration: the ConfigDict users write and override.

Every key a run understands is in the base config, so an unknown
``--config.x=...`` override is rejected by ml_collections instead of being
silently ignored. The keys and their defaults are declared once, as the
fields of the settings classes (``memjax.settings`` for the engine's
sections, ``memjax/tasks/config.py`` for the tasks', each method's
``config.py`` for its own); ``base_config`` lays them out, and
``memjax.build`` reads a config back into those classes. Experiment files
(``configs/*.py``) set values and name variants.

A run saves its config as ``config.json`` (``to_json``); ``from_json``
reads one back with the base config's types.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from typing import Any, Mapping

import ml_collections

from memjax import catalog
from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.checkpoints import convert


def _as_config(value: Any) -> Any:
  """A default as the config holds it: dicts as ConfigDicts."""
  if isinstance(value, Mapping):
    return ml_collections.ConfigDict(
        {k: _as_config(v) for k, v in value.items()}
    )
  return value


def base_config() -> ml_collections.ConfigDict:
  """Returns the default configuration (a small vanilla LM on the demo corpus).

  The engine's sections come first, then each task's and each method's
  sections (``trime``, ``cache``), then the defaults a method sets on
  another section's keys (``eval_memory.sweep_kinds``).

  Raises:
    ValueError: two settings classes declare one section (a bug).
  """
  c = ml_collections.ConfigDict(dict(settings_lib.TOP_KEYS))
  parts = catalog.parts()
  settings_lib.check_owners(parts.settings)
  for cls in parts.settings:
    c[cls.SECTION] = _as_config(settings_lib.section_defaults(cls))
  for key, value in parts.defaults.items():
    section, name = key.split(".")
    c[section][name] = value
  return settle_options(c)


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
    slot: str, name: str, parts: extend.Parts | None = None
) -> dict[str, Any] | None:
  """{option: default} of the kind ``name`` of ``slot`` ('attention' or
  'feed_forward'): its options dataclass's (``extend.option_defaults``);
  None for no kind of that name, or one of the older form."""
  modules = _modules(slot, parts or catalog.parts())
  return extend.option_defaults(modules[name]) if name in modules else None


convert.use_kind_defaults(kind_defaults)


def settled_options(
    slot: str,
    name: str,
    given: Mapping[str, Any] | None,
    parts: extend.Parts | None = None,
) -> dict[str, Any]:
  """The options of the kind ``name``: ``given`` with every option the
  kind declares at its default where unset, less the options of other
  kinds left at their defaults (those a kind picked before filled in)."""
  parts = parts or catalog.parts()
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
  for k, v in settings_lib.plain(dict(given or {})).items():
    own = module is None or k in fields or k in ENGINE_OPTIONS
    if own or not any(k in d and d[k] == v for d in others):
      out[k] = v
  out.update({k: v for k, v in (defaults or {}).items() if k not in out})
  return out


def settle_options(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills ``model.attention_options`` and ``model.feed_forward_options``
  with every option of the chosen kinds at its default
  (``settled_options``), so that ``--config.model.<slot>_options.<name>``
  can set any of them; returns ``c``. ``base_config`` calls it, and a
  config file after picking a kind (``use_kinds``)."""
  model = c.model
  for slot, key, _ in KIND_SLOTS:
    options = settled_options(slot, model[slot], model[key])
    with model.unlocked():
      model[key] = _as_config(options)
  return c


def use_kinds(
    c: ml_collections.ConfigDict,
    attention: str | None = None,
    feed_forward: str | None = None,
) -> ml_collections.ConfigDict:
  """Picks ``model.attention`` and/or ``model.feed_forward`` and settles
  their options (``settle_options``); returns ``c``."""
  if attention is not None:
    c.model.attention = attention
  if feed_forward is not None:
    c.model.feed_forward = feed_forward
  return settle_options(c)


def settled_model(
    model: settings_lib.Model, parts: extend.Parts
) -> settings_lib.Model:
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


def check_overrides(argv: list[str]) -> str | None:
  """Why a command line's override of a kind's option fails, in one line
  naming the kind's options, or None (every such override names one).

  Args:
    argv: the command line, with ``--config=FILE[:VARIANT]`` and
      ``--config.model.<slot>_options.<name>=...`` overrides.
  """
  file = next((a[9:] for a in argv if a.startswith("--config=")), "")
  if not file:
    return None
  path, _, arg = file.partition(":")
  spec = importlib.util.spec_from_file_location("_memjax_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  model = (module.get_config(arg) if arg else module.get_config()).model
  for slot, key, what in KIND_SLOTS:
    prefix = f"--config.model.{key}."
    given = {
        a[len(prefix) :].partition("=")[0]: None
        for a in argv
        if a.startswith(prefix)
    }
    defaults = kind_defaults(slot, model[slot])
    if defaults is not None:
      try:
        extend.check_options(
            given,
            {**defaults, **dict(model[key])},
            f"model.{key} of {what} " f"{model[slot]!r}",
        )
      except errors.ConfigError as e:
        return str(e)
  return None


def parse_variant(
    arg: str, sizes: tuple[str, ...], methods: tuple[str, ...]
) -> tuple[str, str]:
  """Splits a config argument 'method_size' (method optional) into parts.

  Raises:
    errors.ConfigError: naming the accepted variants.
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


def to_json(config: ml_collections.ConfigDict) -> str:
  """The text of a run's ``config.json``."""
  return config.to_json_best_effort(indent=2, sort_keys=True)


def _merge(base: ml_collections.ConfigDict, values: Mapping[str, Any]) -> None:
  for k, v in values.items():
    if k in base and isinstance(base[k], ml_collections.ConfigDict):
      if isinstance(v, Mapping):
        _merge(base[k], v)
        continue
    if k in base and isinstance(base[k], tuple) and isinstance(v, list):
      v = tuple(v)
    elif isinstance(v, Mapping):
      v = ml_collections.ConfigDict(v)
    with base.unlocked():
      if k in base and isinstance(base[k], float) and isinstance(v, int):
        v = float(v)
      base[k] = v


def from_json(text: str) -> ml_collections.ConfigDict:
  """A config saved by ``to_json``, with the base config's types: keys
  that moved since are read at their new place (``renames``); keys it
  does not know are kept as saved."""
  config = base_config()
  saved = settings_lib.translate_tree(json.loads(text), catalog.parts().renames)
  _merge(config, saved)
  settle_options(config)
  config.lock()
  return config
