"""Prints setup.py's requirement of each package named, one per line.

    python requirements/ranges.py jax flax   # jax>=0.10.2,<0.13 ...

`make venv-newest` installs what it prints: the newest releases within
memjax's stated ranges (``install_requires`` first, then the ``dev``
extra's, for the tests). setup.py is read as text by the notebooks' reader
(``colabs.colab.requirements``), not run, so this needs no memjax
installed and no setuptools.
"""

import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from colabs import colab  # pylint: disable=g-import-not-at-top,wrong-import-position


def canonical(name: str) -> str:
  """A distribution's name as pip compares it (ml_collections = ml-collections)."""
  return re.sub(r"[-_.]+", "-", name).lower()


def main(names: list[str]) -> None:
  by_name = {}
  for r in colab.requirements(REPO, ["dev"]):
    by_name.setdefault(canonical(colab.distribution(r)), r)
  missing = [n for n in names if canonical(n) not in by_name]
  if missing:
    print(f"ranges.py: setup.py does not require {missing}", file=sys.stderr)
    sys.exit(2)
  for n in names:
    print(by_name[canonical(n)])


if __name__ == "__main__":
  main(sys.argv[1:])
