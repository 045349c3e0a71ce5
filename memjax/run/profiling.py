"""Traces of chosen training updates with the JAX profiler, for TensorBoard.

``--config.train.profile_steps=(FIRST,COUNT)`` traces the COUNT updates from
FIRST on (numbered as in the progress lines and ``train_log.jsonl``: the
first update is 1) with ``jax.profiler``, on process 0 only, into
``<workdir>/profile/plugins/profile/<date>/<host>.xplane.pb``. TensorBoard
shows it with its profile plugin (the ``tensorboard-plugin-profile``
package): ``tensorboard --logdir <workdir>``, then the Profile tab. Writing
the trace needs neither TensorFlow nor the plugin, and leaves the updates as
they are. A resumed run traces the chosen updates it makes.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax

from memjax import settings as settings_lib
from memjax.io import console


class StepTrace:
  """Runs the updates, tracing those of ``train.profile_steps``.

  Used as a context manager around the loop, so that a run that stops
  inside the traced updates still writes what it traced.
  """

  def __init__(self, train: settings_lib.Train, workdir: str):
    steps = tuple(train.profile_steps or ())  # Checked: settings ranges.
    self.first, self.last = (steps[0], sum(steps) - 1) if steps else (1, 0)
    self.enabled = bool(steps) and jax.process_index() == 0
    self.directory = os.path.join(workdir, "profile")
    self.workdir = workdir
    self.active = False
    self.started = self.traced = 0  # The first and last updates traced.

  def __enter__(self) -> "StepTrace":
    return self

  def __exit__(self, *exc_info) -> None:
    if self.active:
      self._stop()

  def run(self, step: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, the update numbered ``step``, traced if chosen."""
    if not (self.enabled and self.first <= step <= self.last):
      return fn(*args)
    if not self.active:
      jax.profiler.start_trace(self.directory)
      self.active, self.started = True, step
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      out = fn(*args)
    self.traced = step
    if step == self.last:
      jax.block_until_ready(out)  # The trace holds the whole update.
      self._stop()
    return out

  def _stop(self) -> None:
    jax.profiler.stop_trace()
    self.active = False
    console.info(
        "profile of updates %d-%d written under %s (view: tensorboard "
        "--logdir %s, Profile tab)",
        self.started,
        self.traced,
        self.directory,
        self.workdir,
    )
