"""The experiment configuration: the ConfigDict users write and override.

Every key a run understands is in the base config, so an unknown
``--config.x=...`` override is rejected by ml_collections instead of being
silently ignored. The keys and their defaults are declared once, as the
fields of the settings classes (``memjax.settings`` for the engine's
sections, ``memjax/tasks/config.py`` for the tasks', each method's
``config.py`` for its own); ``base_config`` lays them out, and
``memjax.build`` reads a config back into those classes. Experiment files
(``configs/*.py``) set values and name variants.

A run saves its config as ``config.json`` (``settings.to_json``); ``from_json``
reads one back with the base config's types.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any, Mapping

import ml_collections

from memjax import build
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
  parts = build.parts()
  settings_lib.check_owners(parts.settings)
  for cls in parts.settings:
    c[cls.SECTION] = _as_config(settings_lib.section_defaults(cls))
  for key, value in parts.defaults.items():
    section, name = key.split(".")
    c[section][name] = value
  return settle_options(c)


def kind_defaults(slot: str, name: str) -> dict[str, Any] | None:
  """``settings.kind_defaults`` with every part there is."""
  return settings_lib.kind_defaults(slot, name, build.parts())


convert.use_kind_defaults(kind_defaults)


def settle_options(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills ``model.attention_options`` and ``model.feed_forward_options``
  with every option of the chosen kinds at its default
  (``settled_options``), so that ``--config.model.<slot>_options.<name>``
  can set any of them; returns ``c``. ``base_config`` calls it, and a
  config file after picking a kind (``use_kinds``)."""
  model = c.model
  for slot, key, _ in settings_lib.KIND_SLOTS:
    options = settings_lib.settled_options(
        slot, model[slot], model[key], build.parts()
    )
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
  for slot, key, what in settings_lib.KIND_SLOTS:
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
  """A config saved by ``settings.to_json``, with the base config's types: keys
  that moved since are read at their new place (``renames``); keys it
  does not know are kept as saved."""
  config = base_config()
  saved = settings_lib.translate_tree(json.loads(text), build.parts().renames)
  _merge(config, saved)
  settle_options(config)
  config.lock()
  return config
