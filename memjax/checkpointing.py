"""Orbax checkpoints: train state, data position and the model's signature.

A checkpoint step holds three items:

* ``state``: the train state pytree (params, optimiser state, step, carried
  recurrent memory), saved and restored sharded;
* ``data``: the data position (JSON), so a resumed run sees the same batches;
* ``meta``: the model configuration (JSON), checked on restore so that a
  checkpoint of another model is refused with a message naming the keys that
  differ, before anything is loaded or overwritten.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import jax
import orbax.checkpoint as ocp


class CheckpointMismatchError(ValueError):
  """A checkpoint that belongs to a different model."""


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(_flatten(v, key + "."))
    else:
      out[key] = list(v) if isinstance(v, tuple) else v
  return out


def compare_signatures(
    saved: Mapping[str, Any], current: Mapping[str, Any]
) -> list[str]:
  """Returns 'key: saved -> current' lines for every differing model key."""
  a, b = _flatten(saved), _flatten(current)
  diffs = []
  for k in sorted(set(a) | set(b)):
    if a.get(k, "<absent>") != b.get(k, "<absent>"):
      diffs.append(f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}")
  return diffs


class Checkpointer:
  """Saves and restores train states under ``<workdir>/checkpoints``."""

  def __init__(
      self,
      directory: str,
      *,
      keep: int,
      signature: Mapping[str, Any],
      create: bool = True,
  ):
    self.directory = os.path.abspath(directory)
    self.signature = dict(signature)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create),
        item_names=("state", "data", "meta"),
    )

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def read_meta(self, step: int) -> dict[str, Any]:
    return self._manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
    ).meta

  def check_compatible(
      self, step: int, *, ignore: tuple[str, ...] = ()
  ) -> None:
    """Raises CheckpointMismatchError if ``step`` holds another model."""
    saved = self.read_meta(step).get("model", {})
    diffs = [
        d
        for d in compare_signatures(saved, self.signature.get("model", {}))
        if d.split(":")[0] not in ignore
    ]
    if diffs:
      raise CheckpointMismatchError(
          f"checkpoint {self.directory} step {step} was written by a different "
          f"model ({'; '.join(diffs[:6])}{' ...' if len(diffs) > 6 else ''}); "
          "use another --workdir or restore the matching --config"
      )

  def save(
      self,
      step: int,
      state: Any,
      data_position: Mapping[str, Any],
      *,
      force: bool = False,
  ) -> bool:
    saved = self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(dict(data_position)),
            meta=ocp.args.JsonSave(self.signature),
        ),
        force=force,
    )
    return bool(saved)

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restores (state, data position); ``abstract_state`` carries shardings."""
    self.check_compatible(step)
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
        ),
    )
    return restored.state, dict(restored.data)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def restore_params(
    directory: str, abstract_params: Any, step: Optional[int] = None
) -> tuple[Any, int]:
  """Restores only the parameters of another run (``train.init_from``).

  Parameters present in ``abstract_params`` but absent from the checkpoint
  (for example a memory layer added to a memory-less model) are reported by
  the caller, which keeps their fresh initialisation; see
  ``memjax.train.init_params_from``.

  Args:
    directory: a workdir or its ``checkpoints`` folder.
    abstract_params: pytree of jax.ShapeDtypeStruct with shardings.
    step: which step; None = latest.

  Returns:
    (params, step).

  Raises:
    FileNotFoundError: no checkpoint there.
  """
  directory = os.path.abspath(directory)
  if os.path.isdir(os.path.join(directory, "checkpoints")):
    directory = os.path.join(directory, "checkpoints")
  if not os.path.isdir(directory):
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
  restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_params)
  restored = mngr.restore(
      step,
      args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item={"params": abstract_params},
              restore_args={"params": restore_args},
              partial_restore=True,
          )
      ),
  )
  mngr.close()
  return restored.state["params"], step


def abstract_with_sharding(tree: Any, shardings: Any) -> Any:
  """Pairs a pytree of shapes with shardings as jax.ShapeDtypeStructs."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree,
      shardings,
  )
