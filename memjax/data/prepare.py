r"""Downloads and unpacks the official corpus releases.

Usage::

    python -m memjax.data.prepare --corpus=wikitext103 --data_dir=DIR
    python -m memjax.data.prepare --corpus=enwik8 --data_dir=DIR --write_splits
    python -m memjax.data.prepare --corpus=text8 --data_dir=DIR

WikiText-103 ends up as ``DIR/wiki.{train,valid,test}.tokens``; enwik8 and
text8 as the single release file ``DIR/enwik8`` / ``DIR/text8``, which the
readers split 90M/5M/5M (``--write_splits`` also writes the split files
``{train,valid,test}.xml`` / ``.txt``). Nothing is downloaded when the files
are already there. Errors (no network, a broken zip) end the command with one
line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import urllib.error
import urllib.request
import zipfile

from memjax import paths as paths_lib
from memjax.data import sources

_CHUNK_BYTES = 1 << 20


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
  try:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
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
    paths = []
    for member in spec.release_members:
      path = paths_lib.join(data_dir, member)
      with (
          archive.open(by_name[member]) as src,
          paths_lib.open(f"{path}.part", "wb") as dst,
      ):
        shutil.copyfileobj(src, dst, _CHUNK_BYTES)
      paths_lib.rename(f"{path}.part", path)
      paths.append(path)
  return paths


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
) -> list[str]:
  """Downloads (unless present) and unpacks ``corpus`` into ``data_dir``.

  Args:
      corpus: 'wikitext103' (or an alias), 'enwik8' or 'text8'.
      data_dir: destination directory.
      url: release URL; defaults to the official one.
      zip_path: an already downloaded release zip; skips the download.
      write_splits: for enwik8/text8, also write the split files.
      keep_zip: keep the downloaded zip in ``data_dir``.

  Returns:
      The corpus files now in ``data_dir``.

  Raises:
      sources.DataError: download or unpacking failed.
  """
  spec = sources.corpus_spec(corpus)
  data_dir = paths_lib.resolve(data_dir)
  paths_lib.makedirs(data_dir)
  if not is_prepared(spec.name, data_dir):
    downloaded = None
    if zip_path is None:
      url = url or spec.url
      downloaded = paths_lib.join(data_dir, os.path.basename(url))
      zip_path = download(url, downloaded)
    unpack(spec.name, zip_path, data_dir)
    if downloaded and not keep_zip:
      paths_lib.remove(downloaded)
  if write_splits and spec.release_file:
    release = paths_lib.join(data_dir, spec.release_file)
    if paths_lib.isfile(release):
      write_split_files(spec.name, data_dir)
  return sorted(
      {sources.split_path(spec.name, data_dir, s) for s in sources.SPLITS}
  )


def main(argv: list[str] | None = None) -> int:
  """Command line entry point; returns the exit status."""
  parser = argparse.ArgumentParser(
      prog="python -m memjax.data.prepare", description=__doc__.split("\n")[0]
  )
  parser.add_argument(
      "--corpus", required=True, help="wikitext103, enwik8 or text8"
  )
  parser.add_argument("--data_dir", required=True, help="target directory")
  parser.add_argument("--url", default=None, help="release zip URL")
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
  args = parser.parse_args(argv)
  try:
    paths = prepare(
        args.corpus,
        args.data_dir,
        url=args.url,
        zip_path=args.zip,
        write_splits=args.write_splits,
        keep_zip=args.keep_zip,
    )
  except sources.DataError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"{sources.canonical_corpus(args.corpus)} ready: {', '.join(paths)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
