"""Reading a cache file that may be damaged, and setting it aside.

A token cache cut short (a copy stopped midway, a full disk) or otherwise
damaged cannot be read: ``np.load`` of a truncated ``.npz`` raises
``zipfile.BadZipFile``, of a ``.npy`` a ``ValueError``. ``read`` reads a
cache whole; a damaged one is renamed ``<name>.damaged`` (kept for a look,
never read again) when the corpus file it is made from is there, and the
caller rebuilds it; without the corpus it is one line naming the file
(``errors.DataError``), the file left as it is. Nothing else in the cache
directory is touched.
"""

from __future__ import annotations

import zipfile
import zlib
from typing import Callable, Optional, TypeVar

from memjax import errors
from memjax.io import paths

T = TypeVar("T")

# What a damaged cache is renamed to: ``<name>.damaged``.
SUFFIX = ".damaged"

# What reading a damaged .npz or .npy raises (a truncated archive, a bad
# CRC, a missing member, an array cut short).
READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, KeyError)


def read(
    path: str, read_fn: Callable[[str], T], corpus_file: Callable[[], str]
) -> Optional[T]:
  """``read_fn(path)``, or None when the file is damaged and set aside.

  Args:
    path: the cache file (it exists).
    read_fn: reads it whole (every array loaded, not a lazy archive).
    corpus_file: the corpus file the cache is built from, or a
      ``errors.DataError`` when it is not there.

  Returns:
    What ``read_fn`` returned, or None: the file was damaged, is renamed
    ``path + SUFFIX`` and the caller rebuilds it from the corpus.

  Raises:
    errors.DataError: the file is damaged and the corpus is not there.
  """
  try:
    return read_fn(path)
  except READ_ERRORS as e:
    reason = f"{type(e).__name__}: {e}".replace("\n", " ")
  try:
    source = corpus_file()
  except errors.DataError:
    raise errors.DataError(
        f"the cache file {path} is damaged ({reason}) and the corpus it is "
        "built from is not there: copy the cache file again, or delete it "
        "and give data.data_dir the corpus"
    ) from None
  aside = path + SUFFIX
  paths.rename(path, aside)
  print(
      f"memjax.data: the cache file {path} is damaged ({reason}): set aside "
      f"as {aside}, rebuilt from {source}",
      flush=True,
  )
  return None
