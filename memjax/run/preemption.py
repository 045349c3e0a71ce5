"""Stopping a training run cleanly on SIGTERM (preemption) or Ctrl-C.

Cloud schedulers announce a preemption (a TPU maintenance event, a spot VM
taken back) with SIGTERM and kill the process some time later. While the
training loop runs, ``StopSignal`` turns the signal into a request: the loop
finishes the update under way, saves a checkpoint of it (waiting for Orbax's
asynchronous write) and raises ``Preempted``. ``memjax.main`` then exits with
status 128 + the signal's number (143 for SIGTERM, what a shell reports for a
process that SIGTERM ended), so schedulers that restart failed jobs relaunch
it; the relaunched command resumes from that checkpoint. Outside the loop
(set-up, the final evaluation) the signals act as they did before.

Ctrl-C (SIGINT) stops the same way; a second Ctrl-C interrupts at once
(``KeyboardInterrupt``, as without the handler).

With several processes (``--multihost``) every process must stop after the
same update. ``jax.distributed.initialize`` starts JAX's preemption service,
which catches SIGTERM itself and agrees on that update across the processes
(``multihost_utils.reached_preemption_sync_point``; Orbax uses it too); the
loop asks it after every update and leaves SIGTERM to it, and SIGINT as it
was. Where the service is off (``jax_enable_preemption_service=False``), the
processes catch both signals themselves and share their requests by an
all-gather after every update.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from memjax.io import console

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """The training loop stopped on a signal after saving a checkpoint.

  Attributes:
    step: the step of the checkpoint (the last update made).
    signum: the signal's number.
  """

  def __init__(self, step: int, signum: int):
    self.step, self.signum = step, signum
    super().__init__(f"stopped on {signal.Signals(signum).name} at step {step}")

  @property
  def exit_status(self) -> int:
    """128 + the signal's number, as a shell reports a signalled process."""
    return 128 + self.signum


def _preemption_service() -> bool:
  """Whether JAX's preemption service agrees on the step to stop at:
  ``jax.distributed.initialize`` (several processes, or ``--multihost``
  with one) starts it unless ``jax_enable_preemption_service`` is off."""
  return jax.distributed.is_initialized() and bool(
      jax.config.jax_enable_preemption_service
  )


class StopSignal:
  """While entered, SIGTERM and SIGINT ask the training loop to stop.

  The loop calls ``should_stop(step)`` after every update, on every process;
  it is a flag's read on one process. Entered outside the main thread (where
  Python cannot install handlers), nothing is caught, and a signal whose
  handler was installed outside Python is left to it.
  """

  def __init__(self):
    # The number of the signal received (or agreed on), None before.
    self.received: Optional[int] = None
    self._previous: dict[int, Any] = {}
    self._service = False

  def __enter__(self) -> "StopSignal":
    self._service = _preemption_service()
    if self._service:
      return self  # JAX's runtime catches SIGTERM (module docstring).
    if threading.current_thread() is not threading.main_thread():
      return self
    for signum in _SIGNALS:
      # None: a handler Python did not install, which it could not restore.
      if signal.getsignal(signum) is not None:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _handle(self, signum: int, frame: Any) -> None:
    del frame  # Unused.
    if self.received is None:
      self.received = signum
    if signum == signal.SIGINT and signum in self._previous:
      # A second Ctrl-C goes to the previous handler (KeyboardInterrupt).
      signal.signal(signum, self._previous.pop(signum))

  def should_stop(self, step: int) -> bool:
    """Whether every process stops after update ``step`` (1-based)."""
    if self._service:
      if multihost_utils.reached_preemption_sync_point(step):
        self.received = signal.SIGTERM
        return True
      return False
    if jax.process_count() == 1:
      return self.received is not None
    # Any process's signal stops them all (the highest number, if several).
    agreed = int(
        np.max(multihost_utils.process_allgather(np.int32(self.received or 0)))
    )
    if agreed:
      self.received = agreed
    return bool(agreed)

  def stopped(self, step: int, ckpt: Any) -> Preempted:
    """Waits for the checkpoint of ``step`` (a ``checkpointing.Checkpointer``)
    to be written, says so, and returns the exception to raise."""
    ckpt.wait()
    e = Preempted(step, self.received or signal.SIGTERM)
    console.info(
        "%s; checkpoint written to %s: relaunching the same command resumes",
        e,
        ckpt.directory,
    )
    return e
