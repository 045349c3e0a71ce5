"""Prints setup.py's requirement of each package named, one per line.

    python requirements/ranges.py jax flax   # jax>=0.10.2,<0.13 ...

`make venv-newest` installs what it prints: the newest releases within
memjax's stated ranges (``install_requires`` first, then the extras), as a stock JAX image would have them. setup.py is
read as text (its ``install_requires``), not run, so this needs no memjax
and no setuptools.
"""

import ast
import os
import re
import sys

SETUP = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "setup.py"
)


def requirements() -> list[str]:
  """setup.py's ``install_requires``, then its extras' requirements."""
  found = {}
  with open(SETUP) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.keyword) and node.arg in (
        "install_requires",
        "extras_require",
    ):
      found[node.arg] = ast.literal_eval(node.value)
  extras = [r for reqs in found["extras_require"].values() for r in reqs]
  return found["install_requires"] + extras


def name_of(requirement: str) -> str:
  """The canonical name of a requirement string ('etils[epath]>=1' -> etils)."""
  name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
  return re.sub(r"[-_.]+", "-", name).lower()


def main(names: list[str]) -> None:
  by_name = {}
  for r in requirements():
    by_name.setdefault(name_of(r), r)
  missing = [n for n in names if name_of(n) not in by_name]
  if missing:
    print(f"ranges.py: setup.py does not require {missing}", file=sys.stderr)
    sys.exit(2)
  for n in names:
    print(by_name[name_of(n)])


if __name__ == "__main__":
  main(sys.argv[1:])
