"""One training job per workdir: the job's lease (``memjax.io.lease``).

A training mode runs inside ``sole_writer(workdir)``. The lease belongs to
the job, not to a process: process 0 takes it and keeps its heartbeat, and
the other processes of a ``--multihost`` job, which share the workdir by
design, learn from process 0 whether it was taken, so that a refused job
stops in all of its processes with one line (``memjax: error: ...``, exit
status 2). Modes that only read a run (``eval``, ``export``, ``memjax.load``)
take no lease and never wait for one.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from memjax import errors
from memjax.io import lease as lease_lib
from memjax.io import paths


def _agree(taken: bool) -> bool:
  """Process 0's ``taken``, on every process of the job."""
  if jax.process_count() == 1:
    return taken
  return bool(multihost_utils.broadcast_one_to_all(np.int32(taken)))


class LeaseLostError(errors.WorkdirError):
  """Another job took this job's workdir lease while it trained."""


# {workdir: its lease} of the blocks ``sole_writer`` runs in this process.
_HELD: dict[str, Optional[lease_lib.Lease]] = {}


def check_held(workdir: str, step: int) -> None:
  """Raises if this job lost the lease of ``workdir`` (checked by every
  process of the job, before it logs or saves ``step``).

  A job that paused past the staleness period (a stopped process, a
  suspended machine) may find its lease taken by another job, which now
  trains there: it stops instead of writing over that job's files.

  Raises:
    LeaseLostError: one line naming the job that holds the lease now.
  """
  held = _HELD.get(paths.resolve(workdir))
  lost = bool(held and held.lost)
  if jax.process_count() > 1:
    lost = _agree(lost)
  if lost:
    raise LeaseLostError(
        f"--workdir {workdir}: another job took this job's lease "
        f"({held.lost_to() if held else 'as process 0 found'}) while it "
        f"was not answering; it stopped before writing step {step}, and "
        "the files of that job are left as they are"
    )


@contextlib.contextmanager
def sole_writer(workdir: str) -> Iterator[Optional[lease_lib.Lease]]:
  """Holds the lease on ``workdir`` while the block runs (process 0 holds
  it; the others get None).

  Raises:
    lease_lib.BusyError: another job holds it (on process 0).
    errors.WorkdirError: on the other processes, when process 0 was refused.
  """
  lease = None
  if jax.process_index() == 0:
    try:
      lease = lease_lib.Lease(workdir, processes=jax.process_count())
      lease.acquire()
    except BaseException:
      _agree(False)  # The other processes stop too, then this raises.
      raise
  if not _agree(True):
    raise errors.WorkdirError(
        f"--workdir {workdir}: process 0 of this job could not take the "
        "workdir's lease (its message names the job that holds it)"
    )
  workdir = paths.resolve(workdir)
  _HELD[workdir] = lease
  try:
    yield lease
  finally:
    _HELD.pop(workdir, None)
    if lease is not None:
      lease.release()
