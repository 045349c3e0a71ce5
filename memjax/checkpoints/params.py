"""A run's parameters (and model state) alone, from its checkpoints.

What ``train.init_from`` and ``memjax.run.restore`` read of a training
checkpoint without the rest of its train state: ``restore_params``,
``restore_variables`` and ``param_shapes``, each in today's layout
(``memjax.checkpoints.convert``) whatever the checkpoint's.
"""

from __future__ import annotations

from typing import Any, Optional

import orbax.checkpoint as ocp

from memjax import errors
from memjax.checkpoints import convert
from memjax.io import paths


def restore_params(
    directory: str, abstract_params: Any, step: Optional[int] = None
) -> tuple[Any, int]:
  """Restores only the parameters of another run (``train.init_from``).

  Parameters present in ``abstract_params`` but absent from the checkpoint
  (for example a memory layer added to a memory-less model) are reported by
  the caller, which keeps their fresh initialisation; see
  ``memjax.run.init_from.init_params_from``.

  Args:
    directory: a workdir or its ``checkpoints`` folder.
    abstract_params: pytree of jax.ShapeDtypeStruct with shardings.
    step: which step; None = latest.

  Returns:
    (params, step).

  Raises:
    FileNotFoundError: no checkpoint there.
  """
  params, _, step = restore_variables(directory, abstract_params, step)
  return params, step


def restore_variables(
    directory: str,
    abstract_params: Any,
    step: Optional[int] = None,
    abstract_model_state: Any = None,
) -> tuple[Any, Any, int]:
  """(params, model state, step) of a run's checkpoint: ``restore_params``
  that also restores ``TrainState.model_state`` when
  ``abstract_model_state`` is given (else the state is None), and only it
  when ``abstract_params`` is None (the params are then None).

  Raises:
    FileNotFoundError: no checkpoint there.
  """
  directory = paths.resolve(directory)
  if paths.isdir(paths.join(directory, "checkpoints")):
    directory = paths.join(directory, "checkpoints")
  if not paths.isdir(directory):
    raise FileNotFoundError(
        f"train.init_from: no checkpoint directory {directory}"
    )
  mngr = ocp.CheckpointManager(
      directory,
      item_names=("state", "data", "meta"),
      options=ocp.CheckpointManagerOptions(create=False),
  )
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(
        f"train.init_from: no checkpoint steps in {directory}"
    )
  item = {} if abstract_params is None else {"params": abstract_params}
  if abstract_model_state is not None:
    item["model_state"] = abstract_model_state
  layout = _layout(mngr, step).into(item)
  like, item = item, layout.to_saved(item)
  restored = mngr.restore(
      step,
      args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=item,
              restore_args=ocp.checkpoint_utils.construct_restore_args(item),
              partial_restore=True,
          )
      ),
  )
  mngr.close()
  state = convert.placed(layout, dict(restored.state), like)
  return state.get("params"), state.get("model_state"), step


def _layout(mngr: Any, step: int) -> convert.Layout:
  """The layout of a checkpoint step's arrays, from its signature."""
  meta = mngr.restore(
      step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
  ).meta
  return convert.Layout.of(meta or {})


def leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """{"path/to/leaf": shape} of a nested tree of arrays (or metadata)."""
  import flax  # pylint: disable=g-import-not-at-top

  def plain(t: Any) -> Any:  # Orbax's tree metadata is a mapping, no dict.
    return {k: plain(v) for k, v in t.items()} if hasattr(t, "items") else t

  flat = flax.traverse_util.flatten_dict(plain(tree), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items() if hasattr(v, "shape")}


def param_shapes(
    directory: str,
    step: Optional[int] = None,
    item: str = "params",
    like: Any = None,
) -> dict[str, tuple[int, ...]]:
  """{'path/to/param': shape} of a run's checkpoint (latest step), in
  the layout of the model whose tree is ``like`` (None: unscanned); with
  ``item='model_state'``, of its model state ({} when it has none)."""
  mngr = ocp.CheckpointManager(
      directory,
      item_names=("state", "data", "meta"),
      options=ocp.CheckpointManagerOptions(create=False),
  )
  if step is None:
    step = mngr.latest_step()
  layout = _layout(mngr, step).into(like)
  mngr.close()
  ckptr = ocp.StandardCheckpointer()
  try:
    meta = ckptr.metadata(
        paths.join(paths.resolve(directory), str(step), "state")
    ).item_metadata
  finally:
    ckptr.close()
  return layout.shapes_to_current(leaf_shapes(dict(meta).get(item) or {}))


def chosen_steps(path: str, steps: list[int], step: Optional[int]) -> list[int]:
  """The steps to try, newest first: all of ``steps``, or ``[step]``.

  Raises:
    errors.MissingRunError: no steps, or ``step`` is not one of them (the
      message lists them).
  """
  if step is None:
    if not steps:
      raise errors.MissingRunError(f"{path} holds no checkpoint steps")
    return sorted(steps, reverse=True)
  if int(step) not in steps:
    raise errors.MissingRunError(
        f"{path} has no checkpoint at step {step}; the steps there are "
        f"{sorted(steps)} (step=None: the latest)"
    )
  return [int(step)]


def newest_readable(
    directory: str,
    steps: list[int],
    abstract: Any,
    abstract_state: Any,
) -> tuple[Any, Any, int]:
  """The variables of the first of ``steps`` (newest first) whose arrays
  read; a damaged step is skipped with one warning and left in place (a
  reader writes nothing; training sets such a step aside).

  Raises:
    errors.ResumeError: no step there can be read.
  """
  from memjax.io import console  # pylint: disable=g-import-not-at-top

  for i, step in enumerate(steps):
    try:
      return restore_variables(directory, abstract, step, abstract_state)
    except errors.UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      if len(steps) == 1:
        raise errors.ResumeError(
            f"checkpoint step {step} in {directory} cannot be read "
            f"({type(e).__name__}); it is damaged or was never finished"
        ) from None
      fallback = steps[i + 1] if i + 1 < len(steps) else None
      console.warn(
          "checkpoint step %d in %s cannot be read (%s); %s",
          step,
          directory,
          type(e).__name__,
          f"using step {fallback}" if fallback is not None else "no step left",
      )
  raise errors.ResumeError(
      f"no checkpoint in {directory} can be read (steps {steps}): "
      "they are damaged or were never finished; train again"
  )
