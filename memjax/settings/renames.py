"""Keys that moved: one table, applied wherever a config is read.

Methods declare the keys that moved into their sections
(``extend.Method.renames``: ``{'loss.memory': 'trime.memory'}``; a key that
held a whole dict maps its keys: ``{'data.marge': 'marge'}``). Config
files, ``--config.*`` command-line overrides and the ``config.json`` of runs
and exports written with the old keys read through this table: a config
file's or a command line's old key is named on one line (once per process);
a saved run's is read silently.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping, Optional, Sequence

Renames = Mapping[str, str]

_NOTED: set[str] = set()


def _notice(old: str, new: str) -> None:
  """One line per moved key and process, on stderr."""
  if old not in _NOTED:
    _NOTED.add(old)
    print(
        f"memjax: note: config key {old} moved to {new}; read there",
        file=sys.stderr,
    )


def new_key(key: str, renames: Renames) -> Optional[str]:
  """The new dotted key of ``key`` (itself or below a moved key), or None."""
  for old, new in renames.items():
    if key == old:
      return new
    if key.startswith(old + "."):
      return new + key[len(old) :]
  return None


def _pop(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
  """(found, value) of a dotted key of ``tree``, removed from it."""
  *parents, last = key.split(".")
  node: Any = tree
  for p in parents:
    if not isinstance(node, Mapping) or p not in node:
      return False, None
    node = node[p]
  if not isinstance(node, dict) or last not in node:
    return False, None
  return True, node.pop(last)


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
  """Sets a dotted key of ``tree``; a dict merges into a dict already
  there (a whole moved section over the new section's defaults)."""
  *parents, last = key.split(".")
  node = tree
  for p in parents:
    node = node.setdefault(p, {})
  if isinstance(value, Mapping) and isinstance(node.get(last), dict):
    node[last].update(value)
  else:
    node[last] = value


def translate_tree(
    tree: Mapping[str, Any], renames: Renames, *, notice: bool = False
) -> dict[str, Any]:
  """A config as nested dicts (``config.json``'s, or a ConfigDict's
  ``to_dict()``) with every moved key at its new place.

  Args:
    tree: the config.
    renames: old dotted key -> new.
    notice: name each moved key found on stderr (config files and command
      lines; a saved run is read silently).
  """
  out = _copy(tree)
  for old, new in renames.items():
    found, value = _pop(out, old)
    if found:
      if notice:
        _notice(old, new)
      _put(out, new, value)
  return out


def _copy(tree: Any) -> Any:
  if isinstance(tree, Mapping):
    return {k: _copy(v) for k, v in tree.items()}
  return tree


def translate_argv(
    argv: Sequence[str], renames: Renames, flag: str = "config"
) -> list[str]:
  """A command line with ``--config.OLD`` overrides rewritten to the new
  keys (before the flags are parsed: ml_collections refuses a key its
  config lacks), each named on one line."""
  prefix = f"--{flag}."
  out = []
  for arg in argv:
    if arg.startswith(prefix):
      key, eq, value = arg[len(prefix) :].partition("=")
      new = new_key(key, renames)
      if new is not None:
        _notice(key, new)
        arg = f"{prefix}{new}{eq}{value}"
    out.append(arg)
  return out
