"""Installing memjax in a hosted notebook (Colab) without touching its jax.

Colab comes with its own jax and jaxlib (built for its accelerator); the
CPU jaxlib of ``requirements/cpu.lock`` must not replace them. So the
notebooks' set-up cell installs no lock: ``install(root, extras)`` installs
only the requirements of ``setup.py`` (the core's and those of the extras
the notebook's cells use) that the runtime lacks (none of jax, flax, numpy...
on Colab), then memjax itself from the checkout ``root`` with ``--no-deps``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
from typing import Sequence


def _setup_keyword(root: str, name: str):
  """The literal value of ``setup(name=...)`` in ``<root>/setup.py``, read
  without running it."""
  with open(os.path.join(root, "setup.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      for k in node.keywords:
        if k.arg == name:
          return ast.literal_eval(k.value)
  raise ValueError(f"{root}/setup.py has no {name}")


def requirements(root: str, extras: Sequence[str] = ()) -> list[str]:
  """``install_requires`` of ``<root>/setup.py``, then the requirements of
  each of ``extras`` (its ``extras_require``), read without running it.

  Raises:
    ValueError: an extra that setup.py does not declare.
  """
  reqs = list(_setup_keyword(root, "install_requires"))
  if extras:
    declared = _setup_keyword(root, "extras_require")
    for extra in extras:
      if extra not in declared:
        raise ValueError(
            f"setup.py has no extra {extra!r} (it has {sorted(declared)})"
        )
      reqs += [r for r in declared[extra] if r not in reqs]
  return reqs


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


def install(
    root: str,
    extras: Sequence[str] = (),
    *,
    dry_run: bool | None = None,
) -> list[list[str]]:
  """Installs what the runtime lacks of the core and of ``extras``, then
  memjax from ``root`` (editable, no dependencies).

  Args:
    root: a memjax checkout.
    extras: the extras of setup.py the notebook's cells use, e.g. ['data'].
    dry_run: print the pip commands without running them (None: when the
      environment variable MEMJAX_PIP_DRY_RUN is set).

  Returns:
    The pip commands (argument lists), in order.
  """
  if dry_run is None:
    dry_run = bool(os.environ.get("MEMJAX_PIP_DRY_RUN"))
  pip = [sys.executable, "-m", "pip", "install", "-q"]
  commands = []
  if lacking := missing(requirements(root, extras)):
    commands.append(pip + lacking)
  commands.append(pip + ["--no-deps", "-e", root])
  for command in commands:
    print("$", " ".join(command[2:]))
    if not dry_run:
      subprocess.run(command, check=True)
  return commands
