r"""Downloads and unpacks the official corpus releases.

Usage::

    python -m memjax.data.prepare --corpus=wikitext103 --data_dir=DIR
    python -m memjax.data.prepare --corpus=enwik8 --data_dir=DIR --write_splits
    python -m memjax.data.prepare --corpus=text8 --data_dir=DIR

WikiText-103 ends up as ``DIR/wiki.{train,valid,test}.tokens``; enwik8 and
text8 as the single release file ``DIR/enwik8`` / ``DIR/text8``, which the
readers split 90M/5M/5M (``--write_splits`` also writes the split files
``{train,valid,test}.xml`` / ``.txt``). Nothing is downloaded when the files
are already there.

The mirrors of ``memjax.data.releases`` are tried in order (``--url`` names
one instead); an archive, downloaded or given with ``--zip``, is used only
when its size and SHA-256 are the recorded ones (``--sha256=HEX`` names
another checksum, ``--no_verify`` skips the check). A download is verified
under a temporary name before it is unpacked. Errors (no mirror answers, a
wrong checksum, a broken zip) end the command with one line on stderr and
exit status 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import urllib.error
import urllib.request
import zipfile

from memjax import errors
from memjax.data import releases
from memjax.io import paths as paths_lib
from memjax.data import sources

_CHUNK_BYTES = 1 << 20
_USER_AGENT = "memjax-data-prepare"


def download(url: str, dest: str, timeout_s: float = 60.0) -> str:
  """Downloads ``url`` to the file ``dest``, showing one progress line.

  Args:
      url: http(s) or file URL.
      dest: destination file; written atomically.
      timeout_s: socket timeout.

  Returns:
      ``dest``.

  Raises:
      sources.DataError: the download failed (no network, HTTP error).
  """
  tmp = f"{dest}.part"
  # Some hosts refuse urllib's default User-Agent with 403.
  request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
  try:
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
      total = int(response.headers.get("Content-Length") or 0)
      done = 0
      with paths_lib.open(tmp, "wb") as f:
        while chunk := response.read(_CHUNK_BYTES):
          f.write(chunk)
          done += len(chunk)
          of_total = f" of {total / 1e6:.1f}" if total else ""
          print(
              f"\rdownloading {url}: {done / 1e6:.1f}{of_total} MB",
              end="",
              file=sys.stderr,
              flush=True,
          )
      print(file=sys.stderr)
  except (urllib.error.URLError, OSError, ValueError) as e:
    if paths_lib.exists(tmp):
      paths_lib.remove(tmp)
    reason = getattr(e, "reason", None) or e
    raise sources.DataError(
        f"Could not download {url} ({reason}); download it by other means "
        f"and pass its path with --zip, or copy the unpacked files into "
        f"{paths_lib.dirname(dest)}."
    ) from e
  paths_lib.rename(tmp, dest)
  return dest


def obtain_archive(
    corpus: str,
    data_dir: str,
    url: str | None = None,
    zip_path: str | None = None,
    sha256: str | None = None,
    verify: bool = True,
) -> tuple[str, bool]:
  """Returns a verified release archive of ``corpus``, downloading it if needed.

  In order: the archive ``zip_path``; else ``data_dir/<archive>`` left by an
  earlier ``--keep_zip``; else the first of ``url`` (or the corpus's
  mirrors) whose download verifies.

  Args:
      corpus: canonical corpus name.
      data_dir: the corpus directory, where a download is written.
      url: one URL to download instead of the mirrors.
      zip_path: an archive downloaded by other means.
      sha256: the user's own checksum, instead of the recorded one.
      verify: False to accept an archive unchecked (prints a warning).

  Returns:
      (archive path, whether it was downloaded now).

  Raises:
      sources.DataError: no checksum to verify with, no mirror gave the
          archive, or the archive is missing.
      releases.ArchiveMismatchError: the archive has the wrong checksum.
  """
  rel = releases.release(corpus)
  expected = releases.expected_sha256(rel, sha256, verify)
  if expected is None:
    print(
        f"warning: {rel.archive} is used without checking its SHA-256 "
        "(--no_verify)",
        file=sys.stderr,
    )
  if zip_path is not None:
    releases.check_archive(zip_path, rel, expected)
    return zip_path, False
  kept = os.path.join(data_dir, rel.archive)
  if os.path.exists(kept):
    releases.check_archive(kept, rel, expected)
    print(f"using {kept}, downloaded before", file=sys.stderr)
    return kept, False
  return fetch_release(rel, data_dir, (url,) if url else rel.mirrors, expected)


def fetch_release(
    rel: releases.Release,
    data_dir: str,
    urls: tuple[str, ...],
    expected: str | None,
) -> tuple[str, bool]:
  """Downloads ``rel``'s archive from the first of ``urls`` that verifies.

  Each download is written as ``data_dir/<archive>.unverified`` and takes
  the archive's name only once its checksum matches ``expected`` (any file
  when None); a failed or wrong one is deleted and the next URL tried.

  Returns:
      (``data_dir/<archive>``, True).

  Raises:
      sources.DataError: no URL gave the archive; names each one's failure.
  """
  final = os.path.join(data_dir, rel.archive)
  unverified = f"{final}.unverified"
  failures = []
  for i, url in enumerate(urls, 1):
    print(f"trying {url} ({i} of {len(urls)})", file=sys.stderr)
    try:
      download(url, unverified)
      releases.check_archive(unverified, rel, expected)
    except sources.DataError as e:
      if os.path.exists(unverified):
        os.remove(unverified)
      failures.append(f"{url}: {_failure(e)}")
      print(f"{url} failed: {_failure(e)}", file=sys.stderr)
      continue
    os.replace(unverified, final)
    checked = "SHA-256 verified" if expected else "not verified"
    print(f"using {url} ({checked})", file=sys.stderr)
    return final, True
  raise sources.DataError(
      f"Could not download {rel.archive} ({'; '.join(failures)}); "
      f"{releases.where_to_get(rel, expected)}."
  )


def _failure(error: errors.DataError) -> str:
  """Why one download failed, in a few words."""
  if isinstance(error, releases.ArchiveMismatchError):
    return "not the release archive (wrong size or SHA-256)"
  cause = error.__cause__
  if isinstance(cause, urllib.error.HTTPError):
    return f"HTTP {cause.code} {cause.reason}"
  if isinstance(cause, urllib.error.URLError):
    return str(cause.reason)
  return str(cause or error)


def unpack(corpus: str, zip_path: str, data_dir: str) -> list[str]:
  """Extracts the corpus files of a release zip into ``data_dir``.

  Folders inside the zip are dropped (``wikitext-103/wiki.train.tokens``
  becomes ``data_dir/wiki.train.tokens``).

  Args:
      corpus: 'wikitext103' (or an alias), 'enwik8' or 'text8'.
      zip_path: the release zip.
      data_dir: destination directory (created if missing).

  Returns:
      The extracted paths.

  Raises:
      sources.DataError: not a zip, or a corpus file is missing from it.
  """
  spec = sources.corpus_spec(corpus)
  paths_lib.makedirs(data_dir)
  try:
    archive = zipfile.ZipFile(paths_lib.local_file(zip_path))
  except (zipfile.BadZipFile, OSError) as e:
    raise sources.DataError(
        f"{zip_path} is not a readable zip file ({e}); delete it and run "
        "again."
    ) from e
  with archive:
    by_name = {
        os.path.basename(info.filename): info
        for info in archive.infolist()
        if not info.is_dir()
    }
    missing = [m for m in spec.release_members if m not in by_name]
    if missing:
      raise sources.DataError(
          f"{zip_path} has no {', '.join(missing)}; is it the "
          f"{spec.name} release ({spec.url})?"
      )
    paths = [paths_lib.join(data_dir, m) for m in spec.release_members]
    # Every member is extracted before any takes its name, so a failure
    # leaves nothing half unpacked.
    try:
      for member, path in zip(spec.release_members, paths):
        with (
            archive.open(by_name[member]) as src,
            paths_lib.open(f"{path}.part", "wb") as dst,
        ):
          shutil.copyfileobj(src, dst, _CHUNK_BYTES)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
      _remove_parts(paths)
      raise sources.DataError(
          f"{zip_path} is damaged ({e}); delete it and run again."
      ) from e
    except BaseException:
      _remove_parts(paths)
      raise
    for path in paths:
      paths_lib.rename(f"{path}.part", path)
  return paths


def _remove_parts(paths: list[str]) -> None:
  """Deletes the ``.part`` files of ``paths`` that exist."""
  for path in paths:
    if paths_lib.exists(f"{path}.part"):
      paths_lib.remove(f"{path}.part")


def write_split_files(corpus: str, data_dir: str) -> list[str]:
  """Writes the train/valid/test split files of a single-file release.

  Args:
      corpus: 'enwik8' or 'text8'.
      data_dir: directory holding the release file.

  Returns:
      The written paths.

  Raises:
      sources.DataError: not a byte corpus, missing or too small release.
  """
  spec = sources.corpus_spec(corpus)
  if not spec.release_file:
    raise sources.DataError(
        f"{spec.name} ships split files; there is nothing to split."
    )
  release = paths_lib.join(data_dir, spec.release_file)
  if not paths_lib.isfile(release):
    raise sources.DataError(
        f"Release file {release} not found: "
        f"{sources.how_to_get(spec.name, data_dir)}."
    )
  size = paths_lib.getsize(release)
  paths = []
  with paths_lib.open(release, "rb") as src:
    for split in sources.SPLITS:
      start, end = sources.release_split_range(size, split)
      path = paths_lib.join(data_dir, spec.split_files[split])
      src.seek(start)
      with paths_lib.open(f"{path}.part", "wb") as dst:
        dst.write(src.read(end - start))
      paths_lib.rename(f"{path}.part", path)
      paths.append(path)
  return paths


def is_prepared(corpus: str, data_dir: str) -> bool:
  """Whether every split of ``corpus`` can be read from ``data_dir``."""
  try:
    for split in sources.SPLITS:
      sources.split_byte_range(corpus, data_dir, split)
  except sources.DataError:
    return False
  return True


def prepare(
    corpus: str,
    data_dir: str,
    url: str | None = None,
    zip_path: str | None = None,
    write_splits: bool = False,
    keep_zip: bool = False,
    sha256: str | None = None,
    verify: bool = True,
) -> list[str]:
  """Downloads (unless present) and unpacks ``corpus`` into ``data_dir``.

  Args:
      corpus: 'wikitext103' (or an alias), 'enwik8' or 'text8'.
      data_dir: destination directory.
      url: release URL; defaults to the corpus's mirrors, in order.
      zip_path: an already downloaded release zip; skips the download.
      write_splits: for enwik8/text8, also write the split files.
      keep_zip: keep the downloaded zip in ``data_dir``.
      sha256: the archive's SHA-256, instead of the recorded one.
      verify: False to use the archive without checking its SHA-256.

  Returns:
      The corpus files now in ``data_dir``.

  Raises:
      sources.DataError: download, verification or unpacking failed.
  """
  spec = sources.corpus_spec(corpus)
  data_dir = paths_lib.resolve(data_dir)
  paths_lib.makedirs(data_dir)
  if not is_prepared(spec.name, data_dir):
    zip_path, downloaded = obtain_archive(
        spec.name, data_dir, url, zip_path, sha256, verify
    )
    unpack(spec.name, zip_path, data_dir)
    if downloaded and not keep_zip:
      paths_lib.remove(zip_path)
  if write_splits and spec.release_file:
    release = paths_lib.join(data_dir, spec.release_file)
    if paths_lib.isfile(release):
      write_split_files(spec.name, data_dir)
  return sorted(
      {sources.split_path(spec.name, data_dir, s) for s in sources.SPLITS}
  )


def _remove_empty(directory: str) -> None:
  """Removes ``directory`` if it holds no files (only empty folders)."""
  if paths_lib.is_url(directory) or not os.path.isdir(directory):
    return
  if any(files for _, _, files in os.walk(directory)):
    return
  shutil.rmtree(directory)


def main(argv: list[str] | None = None) -> int:
  """Command line entry point; returns the exit status."""
  parser = argparse.ArgumentParser(
      prog="python -m memjax.data.prepare", description=__doc__.split("\n")[0]
  )
  parser.add_argument(
      "--corpus", required=True, help="wikitext103, enwik8 or text8"
  )
  parser.add_argument("--data_dir", required=True, help="target directory")
  parser.add_argument(
      "--url", default=None, help="release zip URL, instead of the mirrors"
  )
  parser.add_argument(
      "--zip", default=None, help="use this release zip, do not download"
  )
  parser.add_argument(
      "--write_splits",
      action="store_true",
      help="enwik8/text8: also write {train,valid,test} split files",
  )
  parser.add_argument(
      "--keep_zip", action="store_true", help="keep the downloaded zip"
  )
  parser.add_argument(
      "--sha256",
      default=None,
      help="the archive's SHA-256, instead of the recorded one",
  )
  parser.add_argument(
      "--no_verify",
      action="store_true",
      help="use the archive without checking its SHA-256",
  )
  args = parser.parse_args(argv)
  if paths_lib.exists(args.data_dir) and not paths_lib.isdir(args.data_dir):
    print(
        f"memjax: error: --data_dir {args.data_dir} is a file, not a folder; "
        "give a folder (it is made if missing)",
        file=sys.stderr,
    )
    return 2
  new = not paths_lib.exists(args.data_dir)
  try:
    paths = prepare(
        args.corpus,
        args.data_dir,
        url=args.url,
        zip_path=args.zip,
        write_splits=args.write_splits,
        keep_zip=args.keep_zip,
        sha256=args.sha256,
        verify=not args.no_verify,
    )
  except errors.UserError as e:
    if new:  # Nothing left behind: the folders this call made, if empty.
      _remove_empty(args.data_dir)
    print(f"memjax: error: {e}", file=sys.stderr)
    return 2
  print(f"{sources.canonical_corpus(args.corpus)} ready: {', '.join(paths)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
