"""Where each corpus's release archive can be downloaded, and its checksum.

``python -m memjax.data.prepare`` tries the mirrors of a corpus in order and
accepts an archive, downloaded or given with ``--zip`` / ``--url``, only when
its size and SHA-256 are the ones recorded here. Every recorded checksum names
the published source it was taken from; a corpus whose checksum no source
publishes would have ``sha256=None`` and is refused unless the user passes
their own ``--sha256`` (or ``--no_verify``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from memjax import errors

_CHUNK_BYTES = 1 << 20


class ArchiveMismatchError(errors.DataError):
  """An archive whose size or SHA-256 is not the recorded one."""


@dataclasses.dataclass(frozen=True)
class Release:
  """One corpus's release archive.

  Attributes:
      corpus: canonical corpus name (``sources.CORPORA``).
      archive: file name of the release zip.
      mirrors: URLs that serve this same archive, tried in order.
      sha256: hex SHA-256 of the archive, or None when no source records it.
      size: the archive's size in bytes, or None when unknown.
  """

  corpus: str
  archive: str
  mirrors: tuple[str, ...]
  sha256: str | None
  size: int | None


RELEASES: dict[str, Release] = {
    "wikitext103": Release(
        corpus="wikitext103",
        archive="wikitext-103-v1.zip",
        # The dataset author's own host first: the original S3 bucket has
        # answered 403 since 2024; it stays last in case it comes back.
        mirrors=(
            "https://wikitext.smerity.com/wikitext-103-v1.zip",
            "https://s3.amazonaws.com/research.metamind.io/wikitext/"
            "wikitext-103-v1.zip",
        ),
        # Hugging Face `datasets`, datasets/wikitext/dataset_infos.json
        # (huggingface/datasets@040102f100964a33fd334e2695f1c493fa6b92db),
        # "wikitext-103-v1" -> download_checksums of the S3 zip.
        sha256=(
            "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"
        ),
        size=190_229_076,
    ),
    "enwik8": Release(
        corpus="enwik8",
        archive="enwik8.zip",
        mirrors=(
            "http://mattmahoney.net/dc/enwik8.zip",
            "https://mattmahoney.net/dc/enwik8.zip",
            "https://data.deepai.org/enwik8.zip",
        ),
        # Hugging Face `datasets`, datasets/enwik8/dataset_infos.json
        # (huggingface/datasets@040102f100964a33fd334e2695f1c493fa6b92db),
        # "enwik8" -> download_checksums of http://mattmahoney.net/dc/enwik8.zip.
        sha256=(
            "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"
        ),
        size=36_445_475,
    ),
    "text8": Release(
        corpus="text8",
        archive="text8.zip",
        mirrors=(
            "http://mattmahoney.net/dc/text8.zip",
            "https://mattmahoney.net/dc/text8.zip",
            "https://data.deepai.org/text8.zip",
        ),
        # TensorFlow, tensorflow/examples/tutorials/word2vec/word2vec_basic.py
        # (tensorflow/tensorflow@05712d4690f39128f69d311e28b8e7181699394b):
        # maybe_download('text8.zip', 31344016, sha256='a6640522...').
        sha256=(
            "a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232"
        ),
        size=31_344_016,
    ),
}


def release(corpus: str) -> Release:
  """The release archive of ``corpus`` (a canonical name).

  Raises:
      errors.DataError: the corpus has no release archive to download.
  """
  if corpus not in RELEASES:
    raise errors.DataError(
        f"{corpus} has no release archive to download; prepare it by hand "
        "as docs/data.md describes and point --config.data.data_dir at it."
    )
  return RELEASES[corpus]


def file_digest(path: str) -> tuple[str, int]:
  """(hex SHA-256, size in bytes) of the file ``path``."""
  digest = hashlib.sha256()
  size = 0
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK_BYTES):
      digest.update(chunk)
      size += len(chunk)
  return digest.hexdigest(), size


def where_to_get(
    rel: Release, sha256: str | None = None, describe: bool = True
) -> str:
  """The advice a refused or missing archive's message ends with.

  Args:
      rel: the release.
      sha256: the checksum wanted, when not the recorded one.
      describe: name the wanted checksum (and the recorded size).
  """
  expected = sha256 or rel.sha256
  details = [f"SHA-256 {expected}"] if expected and describe else []
  if details and expected == rel.sha256 and rel.size:
    details.append(f"{rel.size} bytes")
  what = rel.archive + (f" ({', '.join(details)})" if details else "")
  return (
      f"get {what} from {' or '.join(rel.mirrors)} and pass it with "
      "--zip=PATH"
  )


def expected_sha256(
    rel: Release, sha256: str | None = None, verify: bool = True
) -> str | None:
  """The SHA-256 an archive of ``rel`` must have; None with ``verify=False``.

  Args:
      rel: the release.
      sha256: the user's own checksum (``--sha256``), which wins.
      verify: False for ``--no_verify``.

  Raises:
      errors.DataError: a malformed ``sha256``, or no checksum known for a
          verified archive.
  """
  if sha256 is not None:
    sha256 = sha256.strip().lower()
    if not is_sha256(sha256):
      raise errors.DataError(
          f"--sha256={sha256!r} is not a SHA-256: give 64 hex digits."
      )
    return sha256
  if not verify:
    return None
  if rel.sha256 is None:
    raise errors.DataError(
        f"No published SHA-256 is recorded for {rel.archive}: pass the "
        "archive's checksum with --sha256=HEX, or --no_verify to use it "
        "unchecked."
    )
  return rel.sha256


def check_archive(path: str, rel: Release, expected: str | None) -> None:
  """Raises unless the file ``path`` is the archive ``expected`` names.

  The size is checked as well when ``expected`` is the recorded checksum
  and the size is recorded. ``expected=None`` (``--no_verify``) accepts any
  existing file.

  Raises:
      errors.DataError: ``path`` does not exist.
      ArchiveMismatchError: wrong size or SHA-256.
  """
  if not os.path.isfile(path):
    raise errors.DataError(f"Archive {path} not found: {where_to_get(rel)}.")
  if expected is None:
    return
  digest, size = file_digest(path)
  recorded = expected == rel.sha256
  if digest != expected or (recorded and rel.size and size != rel.size):
    wanted = f"SHA-256 {expected}"
    if recorded and rel.size:
      wanted += f" ({rel.size} bytes)"
    whose = "the recorded" if recorded else "the given"
    raise ArchiveMismatchError(
        f"{path} is not the {rel.corpus} release {rel.archive}: it has "
        f"SHA-256 {digest} ({size} bytes), not {whose} {wanted}; "
        f"{where_to_get(rel, describe=False)}."
    )


def is_sha256(text: str) -> bool:
  """Whether ``text`` is 64 lower-case hex digits."""
  return len(text) == 64 and all(c in "0123456789abcdef" for c in text)
