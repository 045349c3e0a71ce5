"""The one dispatch of the modes, and a saved run restored.

    results = dispatch.run_mode("tune", config, workdir)
    restored = dispatch.restore("runs/demo/trimelm")  # a run or an export

``run_mode`` is what ``python -m memjax.main`` and ``memjax.run_mode``
both call: the workdir checked once, the config resolved (the one given,
else the one the workdir saved), the mode's run kind checked, then the
mode run on the run ``memjax.build`` builds. ``restore`` restores a saved
run or export from its directory alone, reading its config once.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional

import ml_collections

from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.checkpoints import runfiles
from memjax.io import paths
from memjax.io import workdirs
from memjax.pretrained import sizes
from memjax.run import ownership
from memjax.run import restore as restore_lib


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
      workdir, training, build.parts().files_before_training()
  )


def mode_of(name: str) -> extend.Mode:
  """The mode ``name`` (ConfigError naming the modes there are)."""
  return build.parts().modes.get(name)


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
  s = build.read(config, build.parts())
  # The run's kind, from the settings alone: a mode given a kind it does not
  # take is one line before anything is built or written.
  mode.check(name, f"{s.task}/{s.model.family}")
  if mode.before_jax is not None:  # Before the mesh starts JAX's backends.
    mode.before_jax(s)
  # A mode that trains uses every device; one that reads a trained run may
  # name a smaller mesh ({'data': 1}: the first device).
  run = build.build(
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
  run = build.build(
      config, path, mesh=mesh or {"data": -1, "fsdp": 1, "tensor": 1}
  )
  return restore_lib.restore(
      run, files, step=step, with_optimizer=with_optimizer
  )
