"""A run built once from its config, and the one dispatch of the modes.

    run = build.build(config, workdir)          # a memjax.run.spec.Run
    results = build.run_mode("tune", config, workdir)
    restored = build.restore("runs/demo/trimelm")  # a run or an export

``build`` reads the ConfigDict once into typed settings
(``memjax.settings``), looks up the parts they name in the engine's and
the methods' specs (``memjax.catalog``), checks everything that can be
checked before anything is written (names, numbers, the task's and the
methods' checks), binds the task to the settings and makes the mesh.
``run_mode`` is what ``python -m memjax.main`` and ``memjax.run_mode``
both call: the workdir checked once, the config resolved (the one given,
else the one the workdir saved), the mode's run kind checked, then the
mode run on the built run. ``restore`` restores a saved run or export from
its directory alone, reading its config once.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional

import ml_collections

from memjax import catalog
from memjax import config as config_lib
from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax import sharding
from memjax.checkpoints import runfiles
from memjax.io import paths
from memjax.io import workdirs
from memjax.models import attention as attention_lib
from memjax.models import blocks
from memjax.models import block_stack
from memjax.models import stack
from memjax.pretrained import sizes
from memjax.run import optim
from memjax.run import ownership
from memjax.run import restore as restore_lib
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
  parts = catalog.parts()
  s = read(config, parts)
  check(s, parts)
  task = parts.tasks.get(s.task)(s)
  task.check_settings()
  return spec.Run(
      settings=s,
      parts=parts,
      task=task,
      mesh=sharding.mesh_of(s.mesh, mesh),
      workdir=workdir,
      config_json=settings_lib.to_json(config),
  )


def saved_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run or export in ``workdir`` saved.

  Raises:
    errors.MissingRunError: nothing there to take one from.
  """
  files = runfiles.find(workdir)
  return config_lib.from_json(runfiles.read_config_text(files))


def check_workdir(workdir: str, training: bool) -> None:
  """Refuses, before anything is read or written, a workdir whose storage
  cannot be opened or that holds something other than a run.

  Raises:
    errors.StorageError, errors.WorkdirError: one line naming what to fix.
  """
  workdirs.check_workdir(workdir, writes=True, checkpoints=training)
  runfiles.check_workdir(
      workdir, training, catalog.parts().files_before_training()
  )


def mode_of(name: str) -> extend.Mode:
  """The mode ``name`` (ConfigError naming the modes there are)."""
  return catalog.parts().modes.get(name)


def resolve(
    name: str,
    config: Optional[ml_collections.ConfigDict],
    workdir: str,
    overrides: Optional[Mapping[str, Any]] = None,
) -> ml_collections.ConfigDict:
  """The config a mode runs with: ``config``, else the one the workdir's
  run or export saved, with ``overrides`` ({'export.dir': ...}) set. A
  config given for an imported model (in the workdir or
  ``train.init_from``) takes its model settings (``pretrained.sizes``);
  for a mode that needs no weights (``extend.Mode.shape_only``:
  ``--mode=plan``) so does a config naming a Hugging Face folder holding
  only its config.json (``pretrained.path``).

  Raises:
    errors.ConfigError: no config given and none saved.
  """
  if config is None:
    try:
      config = saved_config(workdir)
    except errors.MissingRunError:
      if paths.isfile(paths.join(workdir, runfiles.CONFIG_FILE)):
        raise  # A run with no finished checkpoint: its own message.
      raise errors.ConfigError(
          f"--mode={name} needs --config=FILE:VARIANT: {workdir} holds no "
          "run or export whose saved config.json could be used"
      ) from None
  else:  # An imported model's sizes, whatever the config says.
    tree = json.loads(settings_lib.to_json(config))
    shape_only = mode_of(name).shape_only
    if (sizes.apply_folder if shape_only else sizes.apply)(tree, workdir):
      config = config_lib.from_json(json.dumps(tree))
  if overrides:
    config = config.copy_and_resolve_references()
    with config.unlocked():
      for key, value in overrides.items():
        section, field = key.split(".")
        config[section][field] = value
  return config


def run_mode(
    name: str,
    config: Optional[ml_collections.ConfigDict],
    workdir: str,
    overrides: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
  """Runs ``--mode=name`` on the run ``config`` describes: the one
  dispatch of ``memjax.main`` and ``memjax.run_mode``.

  Args:
    name: a mode (``--mode=list`` shows them).
    config: the config, or None for the one the workdir saved.
    workdir: where the mode reads the run and writes its results.
    overrides: {'section.key': value} set on the config (the command
      line's --export_dir).

  Returns:
    The mode's results dict.

  Raises:
    errors.UserError: an unknown mode, a run of a kind the mode does not
      take, or other bad input (one line naming what to fix).
  """
  mode = mode_of(name)
  check_workdir(workdir, training=mode.training)
  config = resolve(name, config, workdir, overrides)
  s = read(config, catalog.parts())
  # The run's kind, from the settings alone: a mode given a kind it does not
  # take is one line before anything is built or written.
  mode.check(name, f"{s.task}/{s.model.family}")
  if mode.before_jax is not None:  # Before the mesh starts JAX's backends.
    mode.before_jax(s)
  # A mode that trains uses every device; one that reads a trained run may
  # name a smaller mesh ({'data': 1}: the first device).
  run = build(
      config,
      workdir,
      mesh=None if mode.training else dataclasses.asdict(s.mesh),
  )
  if not mode.training:
    return mode.run(run)  # Readers take no lease.
  with ownership.sole_writer(workdir):  # One training job per workdir.
    return mode.run(run)


def restore(
    path: str,
    step: Optional[int] = None,
    *,
    config: Optional[ml_collections.ConfigDict] = None,
    mesh: Optional[Mapping[str, int]] = None,
    with_optimizer: bool = False,
) -> restore_lib.Restored:
  """Restores a workdir or an export from what it saved.

  Args:
    path: a training workdir (``config.json`` + ``checkpoints/``) or an
      export directory (``export.json``).
    step: the checkpoint step of a workdir (None = latest).
    config: use this config instead of the saved one (e.g. other evaluation
      settings); its model must match the saved signature.
    mesh: mesh axis sizes, e.g. {'data': 8}; default: all devices on 'data'.
    with_optimizer: also restore the optimiser state (workdirs only).

  Raises:
    errors.MissingRunError: no run or export at ``path``.
    errors.CheckpointMismatchError: ``config`` describes another model.
  """
  path = paths.resolve(path)
  # A bucket that does not answer (no credentials, no network) is one line
  # within the probe's timeout, not minutes of the backend's retries.
  workdirs.check_workdir(path, name="load")
  files = runfiles.find(path)
  if config is None:
    config = config_lib.from_json(runfiles.read_config_text(files))
  run = build(config, path, mesh=mesh or {"data": -1, "fsdp": 1, "tensor": 1})
  return restore_lib.restore(
      run, files, step=step, with_optimizer=with_optimizer
  )
