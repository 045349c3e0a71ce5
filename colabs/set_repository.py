"""Writes the repository URL everywhere it is named, from its one home.

    python colabs/set_repository.py https://github.com/me/memjax
    python colabs/set_repository.py   # after editing REPOSITORY in setup.py

The URL lives in ``setup.py`` (``REPOSITORY``: the package's project URLs).
This script sets it there (when given one), then copies it into
``CITATION.cff`` (``repository-code``), the set-up cell
``colabs/setup_cell.py`` (what the notebooks clone in Colab), the set-up
cell of every notebook, and each notebook's "Open in Colab" badge (the first
line of its first cell). ``tests/colabs/test_notebooks.py`` checks that they
agree.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRANCH = "main"  # The branch the badges open.
_GITHUB = re.compile(
    r"https://github\.com/([^/\s\"']+)/([^/\s\"']+?)(?:\.git)?/?"
)
_SETUP = re.compile(r'^REPOSITORY = "([^"]*)"$', re.MULTILINE)
_CFF = re.compile(r'^repository-code: "([^"]*)"$', re.MULTILINE)
_CELL = re.compile(r"('MEMJAX_REPO', )'[^']*'")
_BADGE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
# The set-up code ends where each notebook's own lines begin.
END = "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')"


def normalise(url: str) -> str:
  """``https://github.com/<owner>/<name>``, from that form with or without
  ``.git`` or a final slash.

  Raises:
    ValueError: not a GitHub repository URL (Colab's badges open notebooks
      from GitHub only).
  """
  m = _GITHUB.fullmatch(url.strip())
  if not m:
    raise ValueError(
        f"{url!r} is not a GitHub repository URL such as "
        "https://github.com/OWNER/memjax (Colab opens notebooks from GitHub)"
    )
  return f"https://github.com/{m.group(1)}/{m.group(2)}"


def clone_url(repository: str) -> str:
  """What ``git clone`` and the set-up cell take."""
  return repository + ".git"


def badge(repository: str, notebook: str) -> str:
  """The "Open in Colab" badge of ``colabs/<notebook>`` (a file name)."""
  path = repository.removeprefix("https://github.com/")
  return (
      f"{_BADGE}(https://colab.research.google.com/github/{path}/blob/"
      f"{BRANCH}/colabs/{notebook})"
  )


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _write(path: str, text: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def read_repository(root: str = ROOT) -> str:
  """``REPOSITORY`` of ``<root>/setup.py``."""
  m = _SETUP.search(_read(os.path.join(root, "setup.py")))
  if not m:
    raise ValueError(f'{root}/setup.py has no line REPOSITORY = "..."')
  return m.group(1)


def _with_badge(source: str, line: str) -> str:
  if source.startswith(_BADGE):
    source = source.split("\n", 1)[1].lstrip("\n")
  return f"{line}\n\n{source}"


def set_url(url: str | None = None, root: str = ROOT) -> str:
  """Sets ``url`` (None: setup.py's) in setup.py, CITATION.cff, the set-up
  cell and every notebook of ``<root>/colabs``; returns it, normalised."""
  repository = normalise(url if url is not None else read_repository(root))
  setup = os.path.join(root, "setup.py")
  _write(setup, _SETUP.sub(f'REPOSITORY = "{repository}"', _read(setup)))
  cff = os.path.join(root, "CITATION.cff")
  _write(cff, _CFF.sub(f'repository-code: "{repository}"', _read(cff)))
  template = os.path.join(root, "colabs", "setup_cell.py")
  cell = _CELL.sub(
      lambda m: f"{m.group(1)}{clone_url(repository)!r}", _read(template)
  )
  _write(template, cell)
  for path in sorted(glob.glob(os.path.join(root, "colabs", "*.ipynb"))):
    nb = json.loads(_read(path))
    intro, setup_cell = nb["cells"][0], nb["cells"][1]
    source = "".join(setup_cell["source"])
    new = cell + source[source.index(END) :]
    setup_cell["source"] = new.splitlines(keepends=True)
    text = _with_badge(
        "".join(intro["source"]), badge(repository, os.path.basename(path))
    )
    intro["source"] = text.splitlines(keepends=True)
    _write(path, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
  return repository


def main(argv: list[str]) -> int:
  if len(argv) > 2:
    print("usage: python colabs/set_repository.py [URL]", file=sys.stderr)
    return 2
  try:
    repository = set_url(argv[1] if len(argv) == 2 else None)
  except ValueError as e:
    print(f"memjax: error: {e}", file=sys.stderr)
    return 2
  print(f"repository: {repository}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
