"""Errors a user can fix, reported by ``memjax.main`` as one line.

Every problem that comes from the input, not from our code (a config value,
a missing or unreadable data file, a mesh that does not fit, a checkpoint of
another model, an interrupted schedule), raises a subclass of ``UserError``.
``python -m memjax.main`` prints those as ``memjax: error: <message>`` and
exits with status 2; any other exception is a bug and keeps its traceback.

The subclasses also derive from the built-in type a caller would expect
(``ValueError``, ``FileNotFoundError``), so library code may catch either.
"""

from __future__ import annotations


class UserError(Exception):
  """An error in the input: the message names what to fix."""


class ConfigError(UserError, ValueError):
  """A config value that is unknown, out of range or inconsistent."""


class DataError(UserError, ValueError):
  """Missing, unreadable or malformed data (corpus files, datastores)."""


class MeshError(UserError, ValueError):
  """A mesh that does not fit the devices or the batch."""


class CheckpointMismatchError(UserError, ValueError):
  """A checkpoint or export that belongs to a different model."""


class MissingRunError(UserError, FileNotFoundError):
  """No checkpoint, run or export where one is needed."""


class ResumeError(UserError, ValueError):
  """A run that cannot be resumed with the given settings."""


class NonFiniteLossError(UserError, FloatingPointError):
  """The loss or the gradient norm became NaN or infinite."""


class MissingDependencyError(UserError, ImportError):
  """An optional package (an extra of ``setup.py``) that is not installed."""


class StorageError(UserError, OSError):
  """A location that cannot be opened: an unknown URL scheme, a filesystem
  package that is not installed, or missing credentials."""


class WorkdirError(UserError, ValueError):
  """A workdir that holds something other than a run (an export, a
  datastore, a token cache), which a mode must not write into."""
