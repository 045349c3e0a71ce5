"""What a checkpoint's data position records, and the checks on resume.

Batches are a pure function of the step, so what is saved with a
checkpoint besides the arrays (its ``data`` item) is the step and the
settings that make the batches of every step (corpus, batching, seed,
batch and segment sizes, the task's own), the schedule horizon, the
optimiser's layout and the step hooks' states. A resume with settings that
would change any of these stops with a ``ResumeError`` naming them.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from memjax import errors
from memjax import settings as settings_lib
from memjax.checkpoints import checkpointing
from memjax.io import paths
from memjax.run import optim

# Data settings a checkpoint's position depends on.
_POSITION_KEYS = (
    "corpus",
    "batching",
    "seed",
    "batch_size",
    "seq_len",
    "segments_per_lane",
)


def data_position(
    s: settings_lib.Settings,
    task_settings: Mapping[str, Any],
    step: int,
    hook_states: Optional[dict[str, Any]] = None,
) -> dict:
  """What is saved with a checkpoint: the step, the settings that make the
  batches of every step (``task_settings``: the task's own,
  ``Task.data_settings``), the schedule horizon, what shapes the optimiser
  state, and the step hooks' states."""
  d = s.data
  position = {
      "step": int(step),
      "corpus": d.corpus,
      "batching": d.batching,
      "seed": int(s.seed),
      "batch_size": int(d.batch_size),
      "seq_len": int(d.seq_len),
      "segments_per_lane": int(d.segments_per_lane),
      "schedule_steps": int(s.train.num_steps),
      "optim_layout": optim.layout(s.optim),
  }
  if task_settings:
    position["task_data"] = dict(task_settings)
  if hook_states is not None:
    position["hooks"] = hook_states
  return position


def check_data_settings(now: dict, saved: dict, where: str) -> None:
  """Raises ResumeError if resuming ``saved`` with the position ``now``
  (``data_position``) would change the batches (the data settings and the
  task's)."""
  diffs = [
      f"{'seed' if k == 'seed' else 'data.' + k}: {saved[k]!r} -> {now[k]!r}"
      for k in _POSITION_KEYS
      if k in saved and saved[k] != now[k]
  ]
  saved_task = saved.get("task_data", {})
  diffs += [
      f"{k}: {saved_task[k]!r} -> {v!r}"
      for k, v in now.get("task_data", {}).items()
      if k in saved_task and saved_task[k] != v
  ]
  if diffs:
    raise errors.ResumeError(
        f"{where} was trained with other data settings ({'; '.join(diffs)}): "
        "its saved position would point at other batches; resume with the "
        "run's settings, or start a new --workdir with "
        "--config.train.init_from=<this run>"
    )


def check_position(
    now: dict, saved: dict, where: str, extend_schedule: bool
) -> None:
  """Raises ResumeError if resuming ``saved`` with the position ``now``
  would change the batches, not fit the optimiser state or silently
  re-stretch the schedule (unless ``extend_schedule``)."""
  check_data_settings(now, saved, where)
  layout = saved.get("optim_layout")
  if layout is not None and layout != now["optim_layout"]:
    raise errors.ResumeError(
        f"{where} was trained with another optimiser layout ({layout} -> "
        f"{now['optim_layout']}: optim.optimizer, optim.transform or "
        "optim.groups): its optimiser state would not fit; resume with the "
        "run's optim settings, or start a new --workdir with "
        "--config.train.init_from=<this run>"
    )
  horizon = saved.get("schedule_steps")
  if horizon is None or horizon == now["schedule_steps"]:
    return
  if not extend_schedule:
    raise errors.ResumeError(
        f"{where} was trained with a {horizon}-step schedule (learning rate"
        f" and TRIME warm-up); train.num_steps={now['schedule_steps']} would"
        " re-stretch it. To continue this run, add"
        " --config.train.extend_schedule=True (the schedule is rebuilt over"
        " the new num_steps from the saved step on); or start a new --workdir"
        " with --config.train.init_from=<this run>"
    )


def check_resume(now: dict, workdir: str) -> None:
  """Checks the newest checkpoint's data settings (``check_data_settings``)
  before the data is read, so a resume with other settings stops before
  anything (a vocabulary, encoded data) is written into ``workdir``. The
  model, optimiser layout and schedule are checked when the checkpoint is
  restored (they need the model); a position that cannot be read is left
  to the restore, which sets a damaged step aside."""
  directory = paths.join(workdir, "checkpoints")
  if not paths.isdir(directory):
    return
  ckpt = checkpointing.Checkpointer(
      directory, keep=1, signature={}, create=False
  )
  try:
    step = ckpt.latest_step()
    if step is None:
      return
    try:
      saved = ckpt.read_data(step)
    except Exception:  # pylint: disable=broad-except
      return
    check_data_settings(now, saved, ckpt.directory)
  finally:
    ckpt.close()
