"""The package's structure, read from its source (no module is imported).

* The engine (every module outside ``memjax/methods/`` and ``memjax/demos/``)
  never imports a method or a demo, nor names one in a module string (a
  registry's built-in list, a mode target): it reaches the methods through
  the registries only. No library module outside ``memjax/demos/`` imports
  the top-level ``configs``.
* A method imports another only where its paper builds on it.
* No import cycle among memjax's modules, counting the imports inside
  functions too.
* No module over 500 lines and no function over 80, but for the few listed
  below with their reasons.
"""

from __future__ import annotations

import ast
import os
import re

from tests.conftest import REPO

PACKAGE = os.path.join(REPO, "memjax")
# Which method may import which (its paper builds on the other's).
METHOD_IMPORTS = {"external": {"trime", "cache"}}
# (module, function) allowed over 80 lines, with the reason; at most 3.
LONG_FUNCTIONS: dict[tuple[str, str], str] = {}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, str]:
  """{dotted module name: path} of every module of the package."""
  out = {}
  for root, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(root, f)
        rel = os.path.relpath(path, REPO)[: -len(".py")].split(os.sep)
        if rel[-1] == "__init__":
          rel = rel[:-1]
        out[".".join(rel)] = path
  return out


MODULES = _modules()


def _imports(path: str) -> list[tuple[int, str]]:
  """(line, dotted name) of every import in a module, at any depth; a
  ``from a.b import c`` counts as ``a.b.c`` when that is a module."""
  out = []
  tree = ast.parse(open(path, encoding="utf-8").read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for a in node.names:
        full = f"{node.module}.{a.name}"
        out.append((node.lineno, full if full in MODULES else node.module))
  return out


def _strings(path: str) -> list[tuple[int, str]]:
  """(line, text) of every string constant of a module."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  return [
      (n.lineno, n.value)
      for n in ast.walk(tree)
      if isinstance(n, ast.Constant) and isinstance(n.value, str)
  ]


def _area(module: str) -> str:
  """'methods.<name>', 'demos' or 'engine'."""
  parts = module.split(".")
  if len(parts) > 2 and parts[1] == "methods":
    return f"methods.{parts[2]}"
  if len(parts) > 1 and parts[1] in ("methods", "demos"):
    return parts[1]
  return "engine"


def test_the_engine_imports_no_method_demo_or_config():
  bad = []
  named = re.compile(r"^memjax\.(methods|demos)\b")
  for module, path in MODULES.items():
    area = _area(module)
    for line, name in _imports(path):
      where = f"{os.path.relpath(path, REPO)}:{line} {name}"
      if area == "engine" and named.match(name):
        bad.append(where)
      if area != "demos" and (name == "configs" or name.startswith("configs.")):
        bad.append(where)
    if area == "engine":
      for line, text in _strings(path):
        if named.match(text):  # module strings and mode targets
          bad.append(f"{os.path.relpath(path, REPO)}:{line} {text!r}")
  assert (
      not bad
  ), "engine code names a method, a demo or configs:\n" + "\n".join(bad)


def test_methods_import_each_other_only_where_their_papers_build_on_it():
  bad = []
  for module, path in MODULES.items():
    area = _area(module)
    if not area.startswith("methods."):
      continue
    me = area.split(".")[1]
    for line, name in _imports(path):
      other = _area(name)
      if other.startswith("methods.") and other.split(".")[1] != me:
        if other.split(".")[1] not in METHOD_IMPORTS.get(me, set()):
          bad.append(f"{os.path.relpath(path, REPO)}:{line} {name}")
      if other == "demos":
        bad.append(f"{os.path.relpath(path, REPO)}:{line} {name}")
  assert not bad, "\n".join(bad)


def _graph() -> dict[str, set[str]]:
  graph = {m: set() for m in MODULES}
  for module, path in MODULES.items():
    for _, name in _imports(path):
      while name and name not in MODULES:
        name = name.rpartition(".")[0]
      if name and name != module and name != "memjax":
        graph[module].add(name)
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_no_import_cycle():
  assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert _cycles(graph) == [["a", "b", "c"]]


def test_module_and_function_sizes():
  bad = []
  for module, path in sorted(MODULES.items()):
    text = open(path, encoding="utf-8").read()
    lines = text.count("\n")
    if lines > MAX_MODULE_LINES:
      bad.append(f"{module}: {lines} lines")
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > MAX_FUNCTION_LINES and (module, node.name) not in LONG_FUNCTIONS:
          bad.append(f"{module}.{node.name}: {n} lines")
  assert not bad, "\n".join(bad)


def test_the_allow_list_is_short_and_current():
  assert len(LONG_FUNCTIONS) <= 3
  for module, name in LONG_FUNCTIONS:
    tree = ast.parse(open(MODULES[module], encoding="utf-8").read())
    sizes = [
        n.end_lineno - n.lineno + 1
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.name == name
    ]
    assert sizes and max(sizes) > MAX_FUNCTION_LINES, (module, name)
