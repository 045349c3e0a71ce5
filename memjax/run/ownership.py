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


def _agree(taken: bool) -> bool:
  """Process 0's ``taken``, on every process of the job."""
  if jax.process_count() == 1:
    return taken
  return bool(multihost_utils.broadcast_one_to_all(np.int32(taken)))


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
  try:
    yield lease
  finally:
    if lease is not None:
      lease.release()
