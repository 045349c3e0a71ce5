"""Tests of memjax.data.releases: the recorded table and the archive check."""

import dataclasses
import os
import re
import urllib.parse

import pytest

from memjax import errors
from memjax.data import releases
from memjax.data import sources

# SHA-256 of b"abc" (FIPS 180-2, appendix B.1).
ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_recorded_checksums_are_well_formed():
  assert set(releases.RELEASES) == {"wikitext103", "enwik8", "text8"}
  for name, rel in releases.RELEASES.items():
    assert rel.corpus == name and name in sources.CORPORA
    assert re.fullmatch("[0-9a-f]{64}", rel.sha256), name
    assert isinstance(rel.size, int) and rel.size > 0, name
    assert rel.mirrors and len(set(rel.mirrors)) == len(rel.mirrors), name
    for url in rel.mirrors:
      parsed = urllib.parse.urlparse(url)
      assert parsed.scheme in ("http", "https") and parsed.netloc, url
      assert os.path.basename(parsed.path) == rel.archive, url
    # The corpus's own URL is the first mirror.
    assert sources.CORPORA[name].url == rel.mirrors[0]
  # Three different archives.
  assert len({r.sha256 for r in releases.RELEASES.values()}) == 3


def test_every_corpus_with_release_files_has_a_recorded_release():
  with_files = {n for n, s in sources.CORPORA.items() if s.release_members}
  assert with_files == set(releases.RELEASES)
  with pytest.raises(errors.DataError, match="no release archive"):
    releases.release("iwslt_en")


def test_file_digest_of_a_known_input(tmp_path):
  (tmp_path / "abc").write_bytes(b"abc")
  assert releases.file_digest(str(tmp_path / "abc")) == (ABC_SHA256, 3)


def test_check_archive_wants_the_recorded_size_and_checksum(tmp_path):
  path = tmp_path / "text8.zip"
  path.write_bytes(b"abc")
  rel = dataclasses.replace(
      releases.RELEASES["text8"], sha256=ABC_SHA256, size=3
  )
  releases.check_archive(str(path), rel, rel.sha256)
  wrong_size = dataclasses.replace(rel, size=4)
  with pytest.raises(releases.ArchiveMismatchError, match="3 bytes"):
    releases.check_archive(str(path), wrong_size, rel.sha256)
  # The user's own checksum (--sha256) is checked without the size.
  own = dataclasses.replace(rel, sha256="0" * 64, size=4)
  releases.check_archive(str(path), own, ABC_SHA256)
  with pytest.raises(releases.ArchiveMismatchError, match=ABC_SHA256):
    releases.check_archive(str(path), rel, "f" * 64)
  releases.check_archive(str(path), own, None)  # --no_verify
  with pytest.raises(errors.DataError, match="not found"):
    releases.check_archive(str(tmp_path / "none.zip"), rel, None)


def test_expected_sha256():
  rel = releases.RELEASES["enwik8"]
  assert releases.expected_sha256(rel) == rel.sha256
  assert releases.expected_sha256(rel, " " + ABC_SHA256.upper()) == ABC_SHA256
  assert releases.expected_sha256(rel, verify=False) is None
  with pytest.raises(errors.DataError, match="64 hex digits"):
    releases.expected_sha256(rel, "abc")
  unknown = dataclasses.replace(rel, sha256=None, size=None)
  with pytest.raises(errors.DataError, match="--sha256=HEX"):
    releases.expected_sha256(unknown)
