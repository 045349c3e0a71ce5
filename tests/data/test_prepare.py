"""Tests of memjax.data.prepare (no network).

The archives are small zips laid out like the real releases, built here; a
test that needs one accepted records its SHA-256 (computed here with
hashlib) in place of the real release's.
"""

import dataclasses
import functools
import hashlib
import http.server
import os
import threading
import zipfile

import pytest

from memjax import errors
from memjax.data import prepare
from memjax.data import releases
from memjax.data import sources

ARTICLE = " = Gamma = \n \n the end \n"
WIKI_TEXT = " \n = Alpha = \n \n the cat sat . \n" + ARTICLE
WIKI_MEMBERS = {
    f"wikitext-103/wiki.{s}.tokens": WIKI_TEXT for s in sources.SPLITS
}


def _zip(path, members) -> str:
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in members.items():
      z.writestr(name, data)
  return str(path)


def _record(monkeypatch, corpus: str, archive_path: str, **changes) -> str:
  """Records the file ``archive_path`` as ``corpus``'s release archive."""
  data = open(archive_path, "rb").read()
  digest = hashlib.sha256(data).hexdigest()
  fields = {"sha256": digest, "size": len(data), **changes}
  rel = dataclasses.replace(releases.RELEASES[corpus], **fields)
  monkeypatch.setitem(releases.RELEASES, corpus, rel)
  return digest


def _one_line_error(capsys) -> str:
  err = capsys.readouterr().err
  last = err.rstrip("\n").split("\n")[-1]
  assert last.startswith("memjax: error: ") and err.endswith("\n")
  return last[len("memjax: ") :]


# --- corpora -------------------------------------------------------------------


def test_a_corpus_without_a_release_is_one_line(tmp_path, capsys):
  status = prepare.main(["--corpus=iwslt_en", f"--data_dir={tmp_path}"])
  assert status == 2
  assert "no release archive" in _one_line_error(capsys)


# --- archives given with --zip -----------------------------------------------


def test_the_right_archive_prepares(tmp_path, monkeypatch):
  zip_path = _zip(tmp_path / "wikitext-103-v1.zip", WIKI_MEMBERS)
  _record(monkeypatch, "wikitext103", zip_path)
  data_dir = str(tmp_path / "data")
  paths = prepare.prepare("wikitext103", data_dir, zip_path=zip_path)
  assert paths == sorted(
      os.path.join(data_dir, f"wiki.{s}.tokens") for s in sources.SPLITS
  )
  assert sources.read_documents("wikitext", data_dir, "train")[-1] == ARTICLE
  assert sorted(os.listdir(data_dir)) == sorted(map(os.path.basename, paths))
  assert os.path.isfile(zip_path)  # The user's archive stays.


def test_a_wrong_archive_is_refused_in_one_line(tmp_path, capsys):
  # Laid out like the release, but not its bytes: the real checksum refuses.
  zip_path = _zip(tmp_path / "wikitext-103-v1.zip", WIKI_MEMBERS)
  digest = hashlib.sha256(open(zip_path, "rb").read()).hexdigest()
  data_dir = tmp_path / "data"
  status = prepare.main(
      ["--corpus=wikitext", f"--data_dir={data_dir}", f"--zip={zip_path}"]
  )
  assert status == 2
  line = _one_line_error(capsys)
  rel = releases.RELEASES["wikitext103"]
  assert digest in line and rel.sha256 in line and str(rel.size) in line
  assert all(url in line for url in rel.mirrors)
  assert not os.path.exists(data_dir)  # Nothing left behind.
  with pytest.raises(releases.ArchiveMismatchError) as e:
    prepare.prepare("wikitext103", str(data_dir), zip_path=zip_path)
  assert isinstance(e.value, errors.UserError)


def test_a_missing_archive_says_where_to_get_it(tmp_path, capsys):
  status = prepare.main(
      [
          "--corpus=enwik8",
          f"--data_dir={tmp_path / 'data'}",
          f"--zip={tmp_path / 'nowhere.zip'}",
      ]
  )
  assert status == 2
  line = _one_line_error(capsys)
  assert "nowhere.zip not found" in line
  assert "http://mattmahoney.net/dc/enwik8.zip" in line


def test_without_a_recorded_checksum_only_sha256_or_no_verify(
    tmp_path, monkeypatch, capsys
):
  zip_path = _zip(tmp_path / "wikitext-103-v1.zip", WIKI_MEMBERS)
  digest = hashlib.sha256(open(zip_path, "rb").read()).hexdigest()
  _record(monkeypatch, "wikitext103", zip_path, sha256=None, size=None)
  data_dir = tmp_path / "data"
  args = ["--corpus=wikitext103", f"--data_dir={data_dir}", f"--zip={zip_path}"]

  assert prepare.main(args) == 2
  assert "--sha256" in _one_line_error(capsys)
  assert prepare.main(args + ["--sha256=" + "0" * 64]) == 2
  assert digest in _one_line_error(capsys)
  assert prepare.main(args + ["--sha256=xyz"]) == 2
  assert "64 hex digits" in _one_line_error(capsys)
  assert not data_dir.exists() or os.listdir(data_dir) == []

  assert prepare.main(args + [f"--sha256={digest.upper()}"]) == 0
  for f in data_dir.iterdir():
    f.unlink()
  assert prepare.main(args + ["--no_verify"]) == 0
  assert "warning:" in capsys.readouterr().err
  assert (data_dir / "wiki.test.tokens").read_text() == WIKI_TEXT


def test_a_damaged_archive_leaves_nothing_unpacked(tmp_path, monkeypatch):
  zip_path = tmp_path / "wikitext-103-v1.zip"
  members = dict(WIKI_MEMBERS)
  members["wikitext-103/wiki.test.tokens"] = "zzz " * 5000
  _zip(zip_path, members)
  with zipfile.ZipFile(zip_path) as z:
    info = z.getinfo("wikitext-103/wiki.test.tokens")
  raw = bytearray(zip_path.read_bytes())
  # Flip a byte inside the last member's compressed data: a CRC error while
  # the first two members are already extracted.
  start = info.header_offset + 30 + len(info.filename) + len(info.extra)
  raw[start + info.compress_size // 2] ^= 0xFF
  zip_path.write_bytes(bytes(raw))
  _record(monkeypatch, "wikitext103", str(zip_path))
  data_dir = tmp_path / "data"
  with pytest.raises(sources.DataError, match="damaged"):
    prepare.prepare("wikitext103", str(data_dir), zip_path=str(zip_path))
  assert os.listdir(data_dir) == []


def test_a_zip_without_the_corpus_is_refused(tmp_path, monkeypatch):
  zip_path = _zip(tmp_path / "text8.zip", {"readme.txt": "hello"})
  _record(monkeypatch, "text8", zip_path)
  with pytest.raises(sources.DataError, match="has no text8"):
    prepare.prepare("text8", str(tmp_path / "data"), zip_path=zip_path)


# --- downloads ---------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
  """Serves a folder; '/forbidden/...' answers 403; records each path."""

  requested: list[str] = []

  def do_GET(self):
    self.requested.append(self.path)
    if self.path.startswith("/forbidden/"):
      self.send_error(403)
      return
    super().do_GET()

  def log_message(self, *args):
    del args


@pytest.fixture(name="server")
def fixture_server(tmp_path, monkeypatch):
  """(base URL, served folder, requested paths) of a local HTTP server."""
  monkeypatch.setenv("no_proxy", "*")
  root = tmp_path / "served"
  root.mkdir()
  handler = type("Handler", (_Handler,), {"requested": []})
  httpd = http.server.ThreadingHTTPServer(
      ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
  )
  thread = threading.Thread(
      target=httpd.serve_forever, args=(0.05,), daemon=True
  )
  thread.start()
  yield f"http://127.0.0.1:{httpd.server_port}", root, handler.requested
  httpd.shutdown()
  httpd.server_close()


def test_mirrors_are_tried_in_order(tmp_path, monkeypatch, capsys, server):
  base, root, requested = server
  name = "wikitext-103-v1.zip"
  for folder in ("wrong", "good"):
    (root / folder).mkdir()
  _zip(root / "good" / name, WIKI_MEMBERS)
  _zip(root / "wrong" / name, {"wikitext-103/wiki.train.tokens": "other"})
  mirrors = tuple(
      f"{base}/{folder}/{name}"
      for folder in ("forbidden", "missing", "wrong", "good")
  )
  _record(
      monkeypatch, "wikitext103", str(root / "good" / name), mirrors=mirrors
  )
  data_dir = tmp_path / "data"

  status = prepare.main(["--corpus=wikitext103", f"--data_dir={data_dir}"])
  err = capsys.readouterr().err
  assert status == 0, err
  assert requested == [f"/{f}/{name}" for f in ("forbidden", "missing")] + [
      f"/{f}/{name}" for f in ("wrong", "good")
  ]
  lines = [l for l in err.split("\n") if l.startswith("trying")]
  assert lines == [f"trying {m} ({i} of 4)" for i, m in enumerate(mirrors, 1)]
  assert f"using {mirrors[3]} (SHA-256 verified)" in err
  assert "HTTP 403" in err and "HTTP 404" in err
  assert "not the release archive" in err
  assert (data_dir / "wiki.valid.tokens").read_text() == WIKI_TEXT
  # Neither the download nor a rejected one is left behind.
  assert sorted(os.listdir(data_dir)) == [
      f"wiki.{s}.tokens" for s in ("test", "train", "valid")
  ]


def test_no_working_mirror_is_one_line(tmp_path, monkeypatch, capsys, server):
  base, _, requested = server
  rel = releases.RELEASES["text8"]
  mirrors = (f"{base}/forbidden/text8.zip", f"{base}/missing/text8.zip")
  monkeypatch.setitem(
      releases.RELEASES, "text8", dataclasses.replace(rel, mirrors=mirrors)
  )
  data_dir = tmp_path / "data"
  assert prepare.main(["--corpus=text8", f"--data_dir={data_dir}"]) == 2
  line = _one_line_error(capsys)
  assert line.startswith("error: Could not download text8.zip")
  assert f"{mirrors[0]}: HTTP 403" in line and f"{mirrors[1]}: HTTP 404" in line
  assert rel.sha256 in line and "--zip=PATH" in line
  # Nothing left behind: the folder this call made is gone.
  assert len(requested) == 2 and not data_dir.exists()


def test_a_file_url_is_verified_and_split(tmp_path, monkeypatch, capsys):
  eval_bytes = sources.EVAL_SPLIT_BYTES
  data = b"<page>\xc3\xa9</page>\n" * (2 * eval_bytes // 16 + 500)
  zip_path = _zip(tmp_path / "enwik8.zip", {"enwik8": data})
  _record(monkeypatch, "enwik8", zip_path)
  data_dir = tmp_path / "data"
  status = prepare.main(
      [
          "--corpus=enwik8",
          f"--data_dir={data_dir}",
          f"--url=file://{zip_path}",
          "--write_splits",
      ]
  )
  assert status == 0, capsys.readouterr().err
  assert (data_dir / "enwik8").read_bytes() == data
  assert not (data_dir / "enwik8.zip").exists()
  train_len = len(data) - 2 * eval_bytes
  assert (data_dir / "train.xml").read_bytes() == data[:train_len]
  assert (data_dir / "valid.xml").read_bytes() == data[
      train_len : train_len + eval_bytes
  ]
  assert (data_dir / "test.xml").read_bytes() == data[-eval_bytes:]


def test_a_kept_archive_is_reused_or_refused_untouched(
    tmp_path, monkeypatch, capsys
):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  kept = _zip(data_dir / "wikitext-103-v1.zip", WIKI_MEMBERS)
  unreachable = f"file://{tmp_path}/nowhere.zip"
  args = [
      "--corpus=wikitext103",
      f"--data_dir={data_dir}",
      f"--url={unreachable}",
  ]
  before = open(kept, "rb").read()
  assert prepare.main(args) == 2  # Not the recorded archive: refused.
  assert "wikitext-103-v1.zip is not the" in _one_line_error(capsys)
  assert open(kept, "rb").read() == before
  _record(monkeypatch, "wikitext103", kept)
  assert prepare.main(args) == 0  # Verified, so the URL is never tried.
  assert "trying" not in capsys.readouterr().err
  assert (data_dir / "wiki.train.tokens").read_text() == WIKI_TEXT
  assert open(kept, "rb").read() == before


def test_a_data_dir_that_is_a_file_is_one_line_and_left_alone(tmp_path, capsys):
  target = tmp_path / "corpus.txt"
  target.write_text("mine\n")
  assert prepare.main(["--corpus=text8", f"--data_dir={target}"]) == 2
  assert "is a file, not a folder" in _one_line_error(capsys)
  assert target.read_text() == "mine\n"
  assert sorted(os.listdir(tmp_path)) == ["corpus.txt"]
