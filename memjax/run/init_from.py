"""``train.init_from``: a new run starts from the parameters (and model
state) it shares with a trained run or an export.

Parameters with the same path and shape (after ``train.init_from_map``'s
renames) are restored, whatever layout the source saved them in
(``memjax.checkpoints.convert``); the others keep their fresh
initialisation, and both lists are printed.
"""

from __future__ import annotations

from typing import Any

import flax
import jax

from memjax import errors
from memjax.checkpoints import checkpointing
from memjax.checkpoints import convert
from memjax.checkpoints import params as params_lib
from memjax.checkpoints import runfiles
from memjax.io import console
from memjax.io import paths
from memjax.models import layer_layout
from memjax.run import spec
from memjax.run import step as step_lib


def _layout(files: runfiles.RunFiles) -> convert.Layout:
  """The layout of an export's arrays (a run's steps say their own)."""
  return convert.Layout.of(files.read_json(runfiles.EXPORT_FILE)["signature"])


def _saved_shapes(
    files: runfiles.RunFiles, like: Any, item: str = "params"
) -> dict[str, tuple[int, ...]]:
  """{path: shape} of a run's or export's parameters (or model state), in
  the layout of the model whose tree is ``like``."""
  if files.kind == "export":
    directory = files.params_dir if item == "params" else files.model_state_dir
    if item != "params" and not paths.isdir(directory):
      return {}
    return checkpointing.export_param_shapes(
        directory, _layout(files).into(like)
    )
  return params_lib.param_shapes(files.checkpoints, item=item, like=like)


def init_params_from(
    run: spec.Run, source: str, state: step_lib.TrainState, shardings: Any
) -> step_lib.TrainState:
  """Takes the parameters this model shares with the run at ``source``.

  Parameters with the same path and shape are restored (so is the model
  state, e.g. BatchNorm statistics, ``_model_state_from``); parameters only
  this model has keep their fresh initialisation (e.g. a memory layer added to a
  trained model); parameters only the source has are left out. Both lists
  are printed. ``train.init_from_map`` renames paths first.

  Raises:
    errors.MissingRunError: nothing to restore at ``source``.
    errors.CheckpointMismatchError: a shared parameter has another shape,
      or none is shared.
  """
  files = runfiles.find(paths.resolve(source))
  # Matched layer by layer: stacked blocks (model.scan_layers) are
  # unstacked here and stacked again at the end.
  runs = layer_layout.stacked_blocks(state.params)
  abstract = layer_layout.unstack_layers(
      checkpointing.abstract_with_sharding(state.params, shardings.params)
  )
  saved = _saved_shapes(files, abstract)
  flat = flax.traverse_util.flatten_dict(abstract, sep="/")
  rename = tuple(run.settings.train.init_from_map or ())
  src_of = checkpointing.source_paths(flat, saved, rename, source)
  bad = [
      f"{k}: {tuple(saved[src_of[k]])} -> {tuple(v.shape)}"
      for k, v in flat.items()
      if k in src_of and tuple(saved[src_of[k]]) != tuple(v.shape)
  ]
  if bad:
    raise errors.CheckpointMismatchError(
        f"train.init_from={source}: shared parameters differ in shape "
        f"({'; '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}); the models "
        "must agree on the layers they share"
    )
  sub = flax.traverse_util.unflatten_dict(
      {src_of[k]: flat[k] for k in src_of}, sep="/"
  )
  if files.kind == "export":
    restored = checkpointing.restore_export_params(
        files.params_dir, sub, _layout(files)
    )
    step = files.read_json(runfiles.EXPORT_FILE)["step"]
  else:
    restored, step = params_lib.restore_params(files.checkpoints, sub)
  new_flat = flax.traverse_util.flatten_dict(restored, sep="/")
  params = flax.traverse_util.flatten_dict(
      layer_layout.unstack_layers(state.params), sep="/"
  )
  for k, src in src_of.items():
    params[k] = new_flat[src].astype(params[k].dtype)
  fresh = sorted(set(flat) - set(src_of))
  unused = sorted(set(saved) - set(src_of.values()))
  console.info(
      "initialised %d parameter arrays from %s (step %d); fresh: %s; "
      "not used: %s",
      len(src_of),
      source,
      int(step),
      ", ".join(fresh) or "none",
      ", ".join(unused) or "none",
  )
  params = layer_layout.stack_layers(
      flax.traverse_util.unflatten_dict(params, sep="/"), runs
  )
  return state.replace(
      params=jax.device_put(params, shardings.params),
      model_state=_model_state_from(files, state, shardings),
  )


def _model_state_from(
    files: runfiles.RunFiles, state: step_lib.TrainState, shardings: Any
) -> Any:
  """``state``'s model state with what the source holds at the same path
  and shape restored over it (e.g. a pretrained BatchNorm's statistics for
  a fine-tune); the fresh state where the source has none."""
  if state.model_state is None:
    return None
  runs = layer_layout.stacked_blocks(state.model_state)
  abstract = layer_layout.unstack_layers(
      checkpointing.abstract_with_sharding(
          state.model_state, shardings.model_state
      )
  )
  saved = _saved_shapes(files, abstract, "model_state")
  flat = flax.traverse_util.flatten_dict(abstract, sep="/")
  shared = {k: v for k, v in flat.items() if saved.get(k) == tuple(v.shape)}
  if not shared:
    return state.model_state
  sub = flax.traverse_util.unflatten_dict(shared, sep="/")
  if files.kind == "export":
    got = checkpointing.restore_export_params(
        files.model_state_dir, sub, _layout(files)
    )
  else:
    _, got, _ = params_lib.restore_variables(files.checkpoints, None, None, sub)
  fresh = flax.traverse_util.flatten_dict(
      layer_layout.unstack_layers(state.model_state), sep="/"
  )
  fresh.update(flax.traverse_util.flatten_dict(got, sep="/"))
  model_state = layer_layout.stack_layers(
      flax.traverse_util.unflatten_dict(fresh, sep="/"), runs
  )
  return jax.device_put(model_state, shardings.model_state)
