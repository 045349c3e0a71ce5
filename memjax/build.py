"""A run built once from its config.

    run = build.build(config, workdir)          # a memjax.run.spec.Run

``build`` reads the ConfigDict once into typed settings
(``memjax.settings``), looks up the parts they name (``parts()``: the
engine's spec, ``memjax.catalog.ENGINE``, and every method's), checks
everything that can be checked before anything is written (names,
numbers, the task's and the methods' checks), binds the task to the
settings and makes the mesh. The modes run on it through
``memjax.dispatch``.

The methods are found, not listed: every package under ``memjax/methods/``
exports a ``METHOD`` (``memjax.extend.Method``), so nothing here names
one; methods defined outside memjax join through ``memjax.extend.add``.
``parts()`` merges them all into an ``extend.Parts``, in this one place.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import pkgutil
from typing import Mapping, Optional

import ml_collections

from memjax import catalog
from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax import sharding
from memjax.models import attention as attention_lib
from memjax.models import blocks
from memjax.models import block_stack
from memjax.models import stack
from memjax.run import hooks as hooks_lib
from memjax.run import optim
from memjax.run import spec


def read(
    config: ml_collections.ConfigDict, parts: extend.Parts
) -> settings_lib.Settings:
  """The typed settings of ``config``: every declared section (keys that
  moved read at their new place), the model's kinds with every option
  (``settings.settled_model``) and its feed-forward layers counted from the
  start.

  Raises:
    errors.ConfigError: an unknown kind, or an option its kind does not
      declare.
  """
  s = settings_lib.read_all(config, parts.settings, parts.renames)
  model = settings_lib.settled_model(s.model, parts)
  layers = settings_lib.layers_from_the_start(
      model.feed_forward_layers, model.num_layers
  )
  return s.replace(dataclasses.replace(model, feed_forward_layers=layers))


# ----------------------------------------------------------------------------
# Checks every run relies on
# ----------------------------------------------------------------------------


def check_values(s: settings_lib.Settings) -> None:
  """Checks the values every run relies on, before anything is written.

  Raises:
    errors.ConfigError: naming the key and the accepted values.
  """
  settings_lib.check_ranges(s)  # the ranges the sections declare
  if s.eval.score_len > s.eval.window_len:
    raise errors.ConfigError(
        f"eval.score_len {s.eval.score_len} must be <= eval.window_len "
        f"{s.eval.window_len}"
    )
  if s.data.batch_size % s.train.grad_accum:
    raise errors.ConfigError(
        f"data.batch_size {s.data.batch_size} is not divisible by "
        f"train.grad_accum {s.train.grad_accum}"
    )


def check(s: settings_lib.Settings, parts: extend.Parts) -> None:
  """Checks the settings before anything is written.

  Raises:
    errors.ConfigError: naming the key and what it takes (a name nothing
      declares, a number out of range, what the task or a method refuses).
  """
  check_values(s)
  family = parts.families.get(s.model.family)
  attention = parts.attention.get(s.model.attention)
  family.check_attention(s.model.family, s.model.attention, attention)
  attention_lib.check_sliding_window(s.model, family.refuses_attention)
  kind = parts.feed_forward.get(s.model.feed_forward)
  # feed_forward_layers in range, the base kind known.
  block_stack.ModelConfig.of(s.model, vocab_size=0, parts=parts)
  stack.remat_policy(s.model.remat_policy)  # Named right even with remat off.
  blocks.compute_dtype(s.model.dtype)
  blocks.compute_dtype(s.model.param_dtype, "model.param_dtype")
  blocks.check_norm_position(s.model.norm_position)
  if kind.check is not None:
    kind.check(s.model)
  parts.objectives.get(s.loss.name)
  parts.batchers.get(s.data.batching)
  parts.eval_memories.get(s.eval_memory.kind)
  if s.optim.transform:
    parts.optimizer_transforms.get(s.optim.transform)
  optim.group_settings(s.optim)  # ConfigError for a malformed group.
  _check_hooks(s.train, parts.hooks)
  for method_check in parts.checks:
    method_check(s)


def _check_hooks(train: settings_lib.Train, hooks: extend.Lookup[type]) -> None:
  """Raises errors.ConfigError for an unknown step hook, a hook listed
  twice, or a ``hook_options.<name>`` that is not a ConfigDict whose
  ``every`` (default 1, ``memjax.run.hooks.every_of``) is a positive
  integer."""
  names = tuple(train.hooks or ())
  for name in names:
    if name not in hooks:
      raise errors.ConfigError(
          f"unknown step hook {name!r} in train.hooks; there are: "
          f"{', '.join(hooks.names()) or 'none'} (a method declares its "
          "hooks; one defined outside memjax joins with extend.add, e.g. "
          "from the config file)"
      )
    options = (train.hook_options or {}).get(name)
    if options is not None and not isinstance(options, Mapping):
      raise errors.ConfigError(
          f"train.hook_options.{name} must be a ConfigDict, got {options!r}"
      )
    every = (options or {}).get("every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
      raise errors.ConfigError(
          f"train.hook_options.{name}.every must be a positive integer, "
          f"got {every!r}"
      )
  if len(set(names)) != len(names):
    raise errors.ConfigError(f"train.hooks lists a hook twice: {names}")


def build(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    mesh: Optional[Mapping[str, int]] = None,
) -> spec.Run:
  """The run ``config`` describes, in ``workdir``.

  Args:
    config: the experiment config (``configs/<exp>.py``'s ``get_config``).
    workdir: where the run reads and writes (a local path or a URL).
    mesh: mesh axis sizes to use instead of ``config.mesh``, e.g.
      {'data': 1} (restoring onto other devices).

  Raises:
    errors.UserError: bad input, one line naming what to fix.
  """
  known = parts()
  s = read(config, known)
  check(s, known)
  task = known.tasks.get(s.task)(s)
  task.check_settings()
  return spec.Run(
      settings=s,
      parts=known,
      task=task,
      mesh=sharding.mesh_of(s.mesh, mesh),
      workdir=workdir,
      config_json=settings_lib.to_json(config),
  )


# ----------------------------------------------------------------------------
# The parts: the engine's and every method's
# ----------------------------------------------------------------------------


# Where the methods are: every package in this folder is one.
METHODS_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "methods"
)


@functools.cache
def found() -> tuple[extend.Method, ...]:
  """The ``METHOD`` of every package under ``memjax/methods/``, by name.

  Raises:
    TypeError: a package exports no ``extend.Method`` (a bug).
  """
  out = []
  for info in sorted(pkgutil.iter_modules([METHODS_DIR]), key=lambda i: i.name):
    if not info.ispkg:
      continue
    package = importlib.import_module(f"{__package__}.methods.{info.name}")
    method = getattr(package, "METHOD", None)
    if not isinstance(method, extend.Method):
      raise TypeError(f"{package.__name__} exports no extend.Method METHOD")
    out.append(method)
  return tuple(out)


def methods() -> tuple[extend.Method, ...]:
  """The engine, the methods found and those added, in that order."""
  return (catalog.ENGINE,) + found() + extend.added()


def parts() -> extend.Parts:
  """Every part of ``methods()`` by kind and name."""
  return _parts(methods())


_PARTS: dict[tuple[int, ...], extend.Parts] = {}


def _parts(specs: tuple[extend.Method, ...]) -> extend.Parts:
  """The parts of ``specs``, kept per set of specs."""
  key = tuple(id(m) for m in specs)
  if key not in _PARTS:
    made = extend.Parts(specs)
    for name, hook in made.hooks.items():
      if not (isinstance(hook, type) and issubclass(hook, hooks_lib.StepHook)):
        raise TypeError(
            f"step hook {name!r} is not a memjax.run.hooks.StepHook "
            f"subclass: {hook!r}"
        )
    _PARTS[key] = made
  return _PARTS[key]
