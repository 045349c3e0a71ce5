"""The README's commands and the docs' links are true of the checkout.

Every ``make TARGET`` the README names is a target (``make -n`` succeeds),
every ``python -m MODULE`` it names answers ``--help`` (argparse's status 0,
or absl's usage and status 1, without a traceback), and
every relative link in README.md and docs/*.md points at a file that exists
(and, for ``file.md#anchor``, at a heading of that file).
"""

from __future__ import annotations

import concurrent.futures
import glob
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")

# `make demo-ext` in a code span, or a code-block line starting with `make`.
_MAKE = re.compile(r"(?:`|^)make ((?:[a-z][\w-]*))", re.MULTILINE)
# `python -m memjax.main`, `.venv/bin/python -m ...`; a placeholder such as
# `memjax.demos.<name>` is not a module name and is skipped.
_PYTHON_M = re.compile(r"python -m ([A-Za-z_][\w.]*\w)(?![\w.<])")
# [text](target) and ![alt](target); the target ends at the first space or ).
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def make_targets(text: str) -> list[str]:
  """The make targets a Markdown text names, in order, without repeats."""
  return list(dict.fromkeys(_MAKE.findall(text)))


def python_modules(text: str) -> list[str]:
  """The modules a Markdown text runs with ``python -m``, without repeats."""
  return list(dict.fromkeys(_PYTHON_M.findall(text)))


def heading_anchors(text: str) -> set[str]:
  """GitHub's anchors of a Markdown text's headings (outside code blocks)."""
  anchors = set()
  for line in _FENCE.sub("", text).splitlines():
    m = re.match(r"#{1,6} (.*)", line)
    if m:
      title = m.group(1).strip().lower()
      title = re.sub(r"[^\w\- ]", "", title)
      anchors.add(title.replace(" ", "-"))
  return anchors


def broken_links(path: str) -> list[str]:
  """Relative links of a Markdown file whose file or heading is missing."""
  text = _read(path)
  broken = []
  for target in _LINK.findall(_FENCE.sub("", text)):
    if re.match(r"[a-z]+:", target):
      continue  # https:, mailto:
    file_part, _, anchor = target.partition("#")
    resolved = (
        os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if file_part
        else path
    )
    if not os.path.exists(resolved):
      broken.append(f"{target} (no file {os.path.relpath(resolved, REPO)})")
    elif anchor and resolved.endswith(".md"):
      if anchor not in heading_anchors(_read(resolved)):
        broken.append(f"{target} (no heading #{anchor})")
  return broken


def test_extractors_on_a_hand_written_text(tmp_path):
  text = (
      "Run `make demo` or `make demo-pkm-bert`, then\n"
      "```bash\nmake test\n.venv/bin/python -m memjax.main --help\n```\n"
      "and `python -m memjax.demos.<name>`; `python -m memjax.data.prepare`.\n"
      "It makes sense to remake `make demo`.\n"
  )
  assert make_targets(text) == ["demo", "demo-pkm-bert", "test"]
  assert python_modules(text) == ["memjax.main", "memjax.data.prepare"]

  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "a.md").write_text(
      "# A page\n\n## The demo (`make x`)\n"
  )
  page = tmp_path / "page.md"
  page.write_text(
      "[ok](docs/a.md) [ok](docs/a.md#the-demo-make-x) [web](https://x.org)\n"
      "[self](#top-heading) ![img](docs/missing.png) [bad](docs/a.md#nope)\n"
      "# Top heading\n```\n[in code](not/checked.md)\n```\n"
  )
  assert broken_links(str(page)) == [
      "docs/missing.png (no file "
      + os.path.relpath(str(tmp_path / "docs" / "missing.png"), REPO)
      + ")",
      "docs/a.md#nope (no heading #nope)",
  ]


def test_help_answer_told_from_a_crash():
  def done(rc, out, err=""):
    return subprocess.CompletedProcess([], rc, out, err)

  assert _answered_help(done(0, "usage: prepare [--corpus CORPUS]"))
  assert _answered_help(done(1, "flags:\n\nTry --helpfull to get a list"))
  assert not _answered_help(done(1, "", "Traceback (most recent call last)"))
  assert not _answered_help(done(2, "Try --helpfull"))


def test_readme_make_targets_exist():
  targets = make_targets(_read(README))
  assert {"demo", "test", "demo-lamemo", "demo-trime-mt"} <= set(targets)
  for target in targets:
    result = subprocess.run(
        ["make", "-n", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"make -n {target}: {result.stderr}"


def _help(module: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run(
      [sys.executable, "-m", module, "--help"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      env=env,
      check=False,
  )


def test_readme_python_modules_answer_help():
  modules = python_modules(_read(README))
  assert "memjax.main" in modules
  # Two at a time: each imports JAX (a few seconds of one core).
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = dict(zip(modules, pool.map(_help, modules)))
  for module, result in results.items():
    assert _answered_help(result), f"{module} --help: {result.stderr[-2000:]}"


def _answered_help(result: subprocess.CompletedProcess) -> bool:
  """Whether a ``--help`` call printed its usage and exited normally.

  absl's ``--help`` prints the usage and exits with status 1 (absl.app's
  HelpFlag), argparse's with 0; a crash (a traceback) is neither.
  """
  if "Traceback" in result.stderr:
    return False
  if result.returncode == 0:
    return "--" in result.stdout + result.stderr  # it lists its flags
  return result.returncode == 1 and "Try --helpfull" in result.stdout


@pytest.mark.parametrize(
    "path",
    [README] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))),
    ids=os.path.basename,
)
def test_relative_links_point_at_files(path):
  assert broken_links(path) == []
