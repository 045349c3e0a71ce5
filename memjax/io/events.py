"""TensorBoard event files, written without TensorFlow.

CLU's default writer writes its events through TensorFlow; memjax's core
does not need TensorFlow (``memjax.io.optional``), so it writes the same event
files with TensorBoard's own record writer and protocol buffers (the
``tensorboard`` package, no TensorFlow), through ``memjax.io.paths`` so that a
workdir in cloud storage gets them too. ``tensorboard --logdir <workdir>``
reads them.

Objects in cloud storage are whole files: an events file on ``gs://`` (or
any URL) becomes visible when :meth:`EventWriter.flush` closes it; the next
scalars go to a new file, which TensorBoard reads as a continuation.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Mapping

import numpy as np

from memjax.io import paths


class EventWriter:
  """Writes scalars as TensorBoard events (clu's ``write_scalars`` API).

  Attributes:
    logdir: the directory of the event files (a path or a URL).
  """

  def __init__(self, logdir: str, just_logging: bool = False):
    """Creates the writer; files are created at the first write.

    Args:
      logdir: the directory of the event files (a path or a URL).
      just_logging: write nothing (processes other than 0).
    """
    self.logdir = logdir
    self._enabled = not just_logging
    self._file: Any = None
    self._records: Any = None
    self._count = 0

  def _open(self) -> None:
    # Imported here: a process that writes no events never loads them.
    from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
    from tensorboard.summary.writer import record_writer  # pylint: disable=g-import-not-at-top

    paths.makedirs(self.logdir)
    name = (
        f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}"
        f".{self._count}.memjax"
    )
    self._count += 1
    self._file = paths.open(paths.join(self.logdir, name), "wb")
    self._records = record_writer.RecordWriter(self._file)
    version = event_pb2.Event(
        wall_time=time.time(), file_version="brain.Event:2"
    )
    self._records.write(version.SerializeToString())

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes one event holding ``scalars`` (name -> number) at ``step``."""
    if not self._enabled:
      return
    from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import summary_pb2  # pylint: disable=g-import-not-at-top

    if self._file is None:
      self._open()
    values = [
        summary_pb2.Summary.Value(tag=k, simple_value=float(np.asarray(v)))
        for k, v in scalars.items()
    ]
    event = event_pb2.Event(
        wall_time=time.time(),
        step=int(step),
        summary=summary_pb2.Summary(value=values),
    )
    self._records.write(event.SerializeToString())

  def flush(self) -> None:
    """Writes what is buffered; closes the file of a URL (see module doc)."""
    if self._file is None:
      return
    self._file.flush()
    if paths.is_url(self.logdir):
      self.close()

  def close(self) -> None:
    """Closes the current events file (a later write starts a new one)."""
    if self._file is not None:
      self._file.close()
      self._file, self._records = None, None


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """Every scalar in ``logdir``'s event files: tag -> [(step, value)].

  Reads the files with TensorBoard's event loader (no TensorFlow), in file
  name order.
  """
  from tensorboard.backend.event_processing import event_file_loader  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top

  out: dict[str, list[tuple[int, float]]] = {}
  for name in sorted(paths.listdir(logdir)):
    if ".tfevents." not in name:
      continue
    local = paths.local_file(paths.join(logdir, name))
    for event in event_file_loader.EventFileLoader(local).Load():
      for v in event.summary.value:
        value = v.simple_value
        if v.HasField("tensor"):  # tf.summary v2 scalars (CLU, TensorFlow)
          value = float(np.asarray(tensor_util.make_ndarray(v.tensor)))
        out.setdefault(v.tag, []).append((int(event.step), float(value)))
  return out
