"""Installing memjax in a hosted notebook (Colab) without touching its jax.

Colab comes with its own jax and jaxlib (built for its accelerator); the
CPU jaxlib of ``requirements/cpu.lock`` must not replace them. So the
notebooks' set-up cell installs no lock: ``install(root)`` installs only the
requirements of ``setup.py`` that the runtime lacks (none of jax, flax,
numpy... on Colab), then memjax itself from the checkout ``root`` with
``--no-deps``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys


def requirements(root: str) -> list[str]:
  """``install_requires`` of ``<root>/setup.py``, read without running it."""
  with open(os.path.join(root, "setup.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      for k in node.keywords:
        if k.arg == "install_requires":
          return list(ast.literal_eval(k.value))
  raise ValueError(f"{root}/setup.py has no install_requires")


def distribution(requirement: str) -> str:
  """The distribution a requirement names ('etils[epath]>=1.7' -> 'etils')."""
  match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
  if not match:
    raise ValueError(f"not a requirement: {requirement!r}")
  return match.group(0)


def missing(reqs: list[str]) -> list[str]:
  """The requirements whose distribution is not installed (any installed
  version counts as there: the runtime's own jax is kept)."""
  out = []
  for req in reqs:
    try:
      importlib.metadata.version(distribution(req))
    except importlib.metadata.PackageNotFoundError:
      out.append(req)
  return out


def install(root: str, *, dry_run: bool = False) -> list[list[str]]:
  """Installs what the runtime lacks, then memjax from ``root`` (editable,
  no dependencies).

  Args:
    root: a memjax checkout.
    dry_run: print the pip commands without running them.

  Returns:
    The pip commands (argument lists), in order.
  """
  pip = [sys.executable, "-m", "pip", "install", "-q"]
  commands = []
  if lacking := missing(requirements(root)):
    commands.append(pip + lacking)
  commands.append(pip + ["--no-deps", "-e", root])
  for command in commands:
    print("$", " ".join(command[2:]))
    if not dry_run:
      subprocess.run(command, check=True)
  return commands
