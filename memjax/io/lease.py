"""A lease on a directory: one writing job at a time, kept by a heartbeat.

A training job holds ``<workdir>/lease.json`` while it trains: who holds it
(host, boot time, process id and that process's start time, a job id and
the job's start time) and when its heartbeat last rewrote the file. A
background thread rewrites it every ``MEMJAX_LEASE_HEARTBEAT_S`` seconds
(default 30); a lease whose heartbeat is older than ``MEMJAX_LEASE_STALE_S``
(default four heartbeats) is stale and the next job takes it over, so a
relaunch after ``kill -9`` or a lost machine resumes with no manual step.
On the holder's own host the lease is judged at once: a holder process
that is no longer running (its pid gone, reused by another process, or the
host rebooted since) is taken over whatever its heartbeat says. A holder on
another host is watched until its heartbeat moves (the job is refused) or
grows stale (it is taken over): at most one staleness period.

The file goes through the path layer (``memjax.io.paths``), so local
workdirs and URLs are leased alike. No atomic create-if-absent exists on
every fsspec store, so each store gets the strongest one it has:

- local paths: the complete record is written to a temporary file and
  hard-linked to ``lease.json`` (``os.link`` fails if the name exists:
  atomic, and readers never see half a record); the decision to take a
  lease over, and each heartbeat, run under an exclusive ``flock`` of the
  directory, so two jobs on one machine (or on an NFS mount with working
  locks) cannot both win. A filesystem without ``flock`` keeps the atomic
  create but not the serialised take-over.
- ``gs://`` (gcsfs): ``open(mode="xb")`` is an upload with the precondition
  ``ifGenerationMatch=0``, which GCS refuses if the object exists: atomic.
- other fsspec stores: ``open(mode="xb")`` where the backend implements it
  (``memory://``, and any that map it to a conditional write); otherwise a
  check that the file is absent, a write and a read-back that the record is
  this job's. Two jobs that start within the same moment on such a store
  may both believe they hold it; the heartbeat reads the record before
  each rewrite, and a holder that finds another job's record stops beating
  and says so.

On URLs a take-over (reading the stale record again, deleting it, creating
the new one) is not atomic: a take-over racing with another leaves one of
them refused or warned by the heartbeat, as above.

Time is compared between the reader's clock and the heartbeat's (keep the
hosts' clocks in sync, as NTP does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import tempfile
import threading
import time
import uuid
from typing import Callable, Iterator, Optional

import psutil

from memjax import errors
from memjax.io import console
from memjax.io import paths

LEASE_FILE = "lease.json"
HEARTBEAT_ENV = "MEMJAX_LEASE_HEARTBEAT_S"
STALE_ENV = "MEMJAX_LEASE_STALE_S"
DEFAULT_HEARTBEAT_S = 30.0
STALE_HEARTBEATS = 4  # A lease is stale after this many missed heartbeats.

# The job of a record that could not be read (it is taken over at once).
DAMAGED = "damaged"
# Directories this process created by taking their lease (see ``created``).
_CREATED: set[str] = set()


def _env_seconds(name: str, default: float) -> float:
  text = os.environ.get(name)
  if not text:
    return default
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not value > 0:
    raise errors.ConfigError(
        f"{name}={text!r}: give a number of seconds greater than 0"
    )
  return value


def heartbeat_s() -> float:
  """Seconds between heartbeats (``MEMJAX_LEASE_HEARTBEAT_S``)."""
  return _env_seconds(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)


def stale_s() -> float:
  """Heartbeat age after which a lease is stale (``MEMJAX_LEASE_STALE_S``,
  default ``STALE_HEARTBEATS`` heartbeats)."""
  return _env_seconds(STALE_ENV, STALE_HEARTBEATS * heartbeat_s())


def created(directory: str) -> bool:
  """Whether this process created ``directory`` by taking its lease (a
  directory that did not exist before the job; a failed set-up may then
  remove it whole)."""
  return paths.resolve(directory) in _CREATED


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lease, as ``lease.json`` records it.

  Attributes:
    host: the holder's host name.
    boot: the host's boot time (s since the epoch).
    pid: the holding process's id.
    pid_started: that process's start time (s since the epoch).
    job: an id drawn when the job took the lease.
    started: when the job took it (s since the epoch).
    heartbeat: the last heartbeat (s since the epoch).
    processes: the job's processes (``--multihost``).
  """

  host: str
  boot: float
  pid: int
  pid_started: float
  job: str
  started: float
  heartbeat: float
  processes: int = 1

  @classmethod
  def of_this_process(cls, processes: int = 1) -> "Holder":
    now = time.time()
    return cls(
        host=socket.gethostname(),
        boot=psutil.boot_time(),
        pid=os.getpid(),
        pid_started=psutil.Process().create_time(),
        job=uuid.uuid4().hex[:12],
        started=now,
        heartbeat=now,
        processes=processes,
    )

  def to_bytes(self) -> bytes:
    return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

  @classmethod
  def from_bytes(cls, data: bytes) -> Optional["Holder"]:
    """The record, or None for a damaged one."""
    try:
      fields = json.loads(data.decode("utf-8"))
      return cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls)})
    except (ValueError, KeyError, TypeError):
      return None

  def running_here(self) -> Optional[bool]:
    """Whether the holding process is still running: None when it ran on
    another host (which cannot be asked)."""
    if self.host != socket.gethostname():
      return None
    if abs(self.boot - psutil.boot_time()) > 2:
      return False  # The host has restarted since.
    try:
      started = psutil.Process(self.pid).create_time()
    except psutil.NoSuchProcess:
      return False
    except psutil.AccessDenied:
      return True
    return abs(started - self.pid_started) < 1  # Else the pid was reused.

  def describe(self, now: float) -> str:
    """Who holds the lease, in words (for messages)."""
    if self.job == DAMAGED:
      return "an unreadable record: not a lease written by memjax"
    return (
        f"host {self.host}, pid {self.pid}, started "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))}, "
        f"heartbeat {max(0.0, now - self.heartbeat):.0f} s ago"
    )


class BusyError(errors.WorkdirError):
  """Another job holds the workdir's lease."""


# -- The store's primitives ----------------------------------------------------


def _read(path: str) -> Optional[Holder]:
  """The record at ``path``; None if there is none; a damaged record reads
  as a holder whose heartbeat never came (stale)."""
  try:
    data = paths.read_bytes(path)
  except FileNotFoundError:
    return None
  holder = Holder.from_bytes(data)
  return holder or Holder("?", 0.0, 0, 0.0, DAMAGED, 0.0, 0.0)


def _create(path: str, data: bytes) -> bool:
  """Writes ``data`` to ``path`` if nothing is there; whether it did."""
  if not paths.is_url(path):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".lease-")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(data)
      os.link(tmp, path)
      return True
    except FileExistsError:
      return False
    finally:
      os.remove(tmp)
  if paths.exists(path):
    return False
  try:
    with paths.open(path, "xb") as f:
      f.write(data)
  except FileExistsError:
    return False
  except (ValueError, NotImplementedError):  # No "xb": write, read back.
    paths.write_bytes(path, data)
  return _read(path) == Holder.from_bytes(data)


@contextlib.contextmanager
def _serialised(directory: str) -> Iterator[None]:
  """An exclusive ``flock`` of a local directory while the block runs
  (nothing for URLs or where ``flock`` is not supported)."""
  if paths.is_url(directory):
    yield
    return
  import fcntl  # pylint: disable=g-import-not-at-top

  fd = os.open(directory, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
      pass
    yield
  finally:
    os.close(fd)  # Closing the descriptor releases the lock.


# -- The lease -----------------------------------------------------------------


class Lease:
  """The lease on ``directory`` for this process's job.

  ``acquire()`` takes it (or raises ``BusyError`` naming the holder) and
  starts the heartbeat; ``release()`` stops the heartbeat and deletes the
  record. As a context manager it does both.

  Attributes:
    path: ``<directory>/lease.json``.
    me: this job's record.
    lost: set when a heartbeat found another job's record (or none).
    taken_by: that other job's record (None: none, or not lost).
  """

  def __init__(
      self,
      directory: str,
      processes: int = 1,
      heartbeat: Optional[float] = None,
      stale: Optional[float] = None,
      clock: Callable[[], float] = time.time,
  ):
    self.directory = paths.resolve(directory)
    self.path = paths.join(self.directory, LEASE_FILE)
    self.heartbeat_s = heartbeat or heartbeat_s()
    if stale is None and heartbeat and not os.environ.get(STALE_ENV):
      stale = STALE_HEARTBEATS * heartbeat
    self.stale_s = stale or stale_s()
    self._clock = clock
    self.me = Holder.of_this_process(processes)
    self.lost = False
    self.taken_by: Optional[Holder] = None
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def __enter__(self) -> "Lease":
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()

  def _record(self) -> bytes:
    self.me = dataclasses.replace(self.me, heartbeat=self._clock())
    return self.me.to_bytes()

  def acquire(self) -> None:
    """Takes the lease, taking a stale one over; starts the heartbeat.

    Raises:
      BusyError: another job holds it (one line: the holder, its
        heartbeat's age, what to do).
    """
    if not paths.exists(self.directory):
      paths.makedirs(self.directory)
      _CREATED.add(self.directory)
    seen, wait_until = None, None
    while True:
      with _serialised(self.directory):
        if _create(self.path, self._record()):
          break
        holder = _read(self.path)
        verdict = holder and self._judge(holder, seen)
        if verdict == "take" and self._take_over(holder):
          console.info(
              "took over the lease of %s from %s",
              self.directory,
              self._former(holder),
          )
          break
        if verdict == "refuse":
          raise self._busy(holder)
      if verdict == "wait" and seen is None:
        seen, wait_until = holder, self._clock() + self.stale_s
        console.info(
            "%s is leased from another host (%s): waiting up to %.0f s for "
            "its next heartbeat",
            self.path,
            holder.describe(self._clock()),
            self.stale_s,
        )
      time.sleep(min(1.0, self.heartbeat_s / 4))
      if wait_until is not None and self._clock() > wait_until + 60:
        raise self._busy(seen)  # The holder's clock runs far ahead.
    self._thread = threading.Thread(
        target=self._beat, name="memjax-lease", daemon=True
    )
    self._thread.start()

  def _judge(self, holder: Holder, seen: Optional[Holder]) -> str:
    """'take', 'refuse' or 'wait' for a lease ``holder`` holds."""
    if holder.job == self.me.job:
      return "take"
    if self._clock() - holder.heartbeat > self.stale_s:
      return "take"
    running = holder.running_here()
    if running is not None:
      return "refuse" if running else "take"
    if seen is not None and (holder.job, holder.heartbeat) != (
        seen.job,
        seen.heartbeat,
    ):
      return "refuse"  # Its heartbeat moved: it is alive.
    return "wait"

  def _former(self, holder: Holder) -> str:
    """The holder a lease was taken over from, in words."""
    if holder.job == DAMAGED:
      return holder.describe(self._clock())
    return f"a job that is gone ({holder.describe(self._clock())})"

  def _take_over(self, holder: Holder) -> bool:
    """Replaces ``holder``'s record by this job's; whether it did."""
    if not paths.is_url(self.path):  # Serialised by the directory's flock.
      paths.write_bytes(self.path, self._record())
      return True
    if _read(self.path) != holder:
      return False  # Someone else moved first: judge again.
    with contextlib.suppress(FileNotFoundError):
      paths.remove(self.path)
    return _create(self.path, self._record())

  def _busy(self, holder: Holder) -> BusyError:
    return BusyError(
        f"--workdir {self.directory} is being trained by another job "
        f"({holder.describe(self._clock())}); nothing was written: wait "
        "for it to finish, stop it, or train into another --workdir (a "
        f"lease whose heartbeat is older than {self.stale_s:.0f} s is "
        "taken over)"
    )

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      try:
        with _serialised(self.directory):
          holder = _read(self.path)
          if holder is None or holder.job != self.me.job:
            self.taken_by = holder
            self.lost = True
          else:
            paths.write_bytes(self.path, self._record())
      except Exception as e:  # pylint: disable=broad-except
        # A store that does not answer: try again at the next heartbeat.
        console.warn("lease heartbeat of %s failed: %s", self.path, e)
        continue
      if self.lost:
        console.warn(
            "the lease %s was taken from this job (%s): it stops before "
            "it writes again",
            self.path,
            self.lost_to(),
        )
        return

  def lost_to(self) -> str:
    """Who took the lease: the other job's record, described."""
    if self.taken_by is None:
      return "its record was removed"
    return self.taken_by.describe(self._clock())

  def release(self) -> None:
    """Stops the heartbeat and deletes this job's record (a record another
    job wrote is left as it is)."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    try:
      with _serialised(self.directory):
        holder = _read(self.path)
        if holder is not None and holder.job == self.me.job:
          paths.remove(self.path)
    except (FileNotFoundError, NotADirectoryError):
      pass  # The directory is gone (a failed set-up removed it).
    except Exception as e:  # pylint: disable=broad-except
      # The next job takes the record over once it is stale.
      console.warn("could not release the lease %s: %s", self.path, e)
    if self.directory in _CREATED and not paths.is_url(self.directory):
      _CREATED.discard(self.directory)
      with contextlib.suppress(OSError):
        os.rmdir(self.directory)  # Only if the job left nothing in it.
