"""Workdir checks: before anything is read or written, a workdir's storage
must open (its scheme's package installed, credentials that answer within
``PROBE_TIMEOUT_S``), a local one must be writable, and one that will hold
checkpoints must be on storage Orbax opens.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from memjax import errors
from memjax.io import paths

# pylint: disable=protected-access  (the path layer's scheme helpers)

# Loggers of the fsspec backends, quiet while check_workdir probes.
_BACKEND_LOGGERS = ("gcsfs", "s3fs", "fsspec", "google", "aiobotocore")

# How long check_workdir waits for a remote filesystem to answer.
PROBE_TIMEOUT_S = 6.0

_CREDENTIALS = {
    "gs": "gcloud auth application-default login",
    "gcs": "gcloud auth application-default login",
    "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws/credentials",
}

# The URL schemes Orbax's checkpoints open (through etils.epath).
CHECKPOINT_SCHEMES = ("gs", "s3")


def _check_writable(path: str) -> None:
  """A local workdir (or its nearest existing parent) must be a folder this
  user can write in."""
  path = os.path.abspath(paths._local(path))
  if os.path.exists(path) and not os.path.isdir(path):
    return  # The workdir check names a workdir that is a file.
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise errors.StorageError(
        f"--workdir {path}: {existing} is a file, not a folder; choose "
        "another --workdir"
    )
  if not os.access(existing, os.W_OK | os.X_OK):
    raise errors.StorageError(
        f"--workdir {path}: {existing} is not writable by this user "
        "(permission denied); choose a --workdir you can write in"
    )


def check_workdir(
    path: str,
    timeout_s: float = PROBE_TIMEOUT_S,
    *,
    writes: bool = False,
    checkpoints: bool = False,
    name: str = "--workdir",
) -> None:
  """Checks that a workdir's filesystem can be opened; writes nothing.

  A local path passes (with ``writes``: if it, or its nearest existing
  parent, is a folder this user can write in). For a URL, the scheme's
  filesystem must be installed, its checkpoints must be ones Orbax opens
  (``checkpoints``: ``CHECKPOINT_SCHEMES``), and asking whether ``path``
  exists must answer within ``timeout_s`` (a bucket without credentials
  otherwise waits on retries). ``name`` says what gave the path in the
  messages ('--workdir', 'memjax.load').

  Raises:
    errors.StorageError: one line naming what to install or configure.
  """
  if not paths.is_url(path):
    if writes:
      _check_writable(path)
    return
  paths._filesystem_class(path)  # An unknown scheme or a missing package: now.
  scheme = paths._scheme(path)
  if checkpoints and scheme not in CHECKPOINT_SCHEMES:
    raise errors.StorageError(
        f"--workdir {path}: training writes Orbax checkpoints, which open "
        "local paths, gs:// and s3:// only, not "
        f"{scheme}://; choose a local or gs:// --workdir"
    )
  outcome: dict[str, Any] = {}

  def probe() -> None:
    try:  # Making the filesystem may look for credentials: timed too.
      outcome["exists"] = paths.filesystem(path).exists(path)
    except Exception as e:  # pylint: disable=broad-except
      outcome["error"] = e

  # The backends log their retries (gcsfs: "Could not determine bucket
  # type ..."); the answer is the one line below, so they stay quiet.
  quiet = [logging.getLogger(n) for n in _BACKEND_LOGGERS]
  levels = [q.level for q in quiet]
  for q in quiet:
    q.setLevel(logging.CRITICAL)
  thread = threading.Thread(target=probe, daemon=True)
  thread.start()
  thread.join(timeout_s)
  if not thread.is_alive():
    for q, level in zip(quiet, levels):
      q.setLevel(level)
  how = _CREDENTIALS.get(scheme, f"the credentials of {scheme}://")
  if thread.is_alive():
    raise errors.StorageError(
        f"{name} {path}: {scheme}:// did not answer within "
        f"{timeout_s:.0f} s; check the network and the credentials ({how})"
    )
  if "error" in outcome:
    e = outcome["error"]
    reason = " ".join(str(e).split())[:160] or type(e).__name__
    raise errors.StorageError(
        f"{name} {path} cannot be opened ({type(e).__name__}: {reason}); "
        f"check the bucket name and the credentials ({how})"
    )
