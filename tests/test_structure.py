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
import tokenize

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


# ----------------------------------------------------------------------------
# The run built once: few top-level modules, no facades, typed parts
# ----------------------------------------------------------------------------

# At most this many modules at the top of memjax/ (besides __init__.py).
MAX_TOP_MODULES = 10
# At most this many functions take a whole config: the builders, the config
# file's own functions, the entry points (memjax.main, memjax.api, the
# demos). Counted by annotation and by the names below.
MAX_CONFIG_FUNCTIONS = 40
CONFIG_NAMES = {"config", "cfg", "conf", "c"}


def _tree(path: str) -> ast.Module:
  return ast.parse(open(path, encoding="utf-8").read())


def test_at_most_ten_modules_at_the_top():
  top = sorted(
      f for f in os.listdir(PACKAGE) if f.endswith(".py") and f != "__init__.py"
  )
  assert len(top) <= MAX_TOP_MODULES, top


def config_functions(modules=None) -> list[str]:
  """'module.function' of every function with a parameter annotated as a
  ConfigDict or named config, cfg, conf or c."""
  out = []
  for module, path in sorted((modules or MODULES).items()):
    for node in ast.walk(_tree(path)):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      a = node.args
      params = a.posonlyargs + a.args + a.kwonlyargs
      params += [p for p in (a.vararg, a.kwarg) if p is not None]
      for p in params:
        note = ast.unparse(p.annotation) if p.annotation else ""
        if p.arg in CONFIG_NAMES or "ConfigDict" in note:
          out.append(f"{module}.{node.name}")
          break
  return out


def test_few_functions_take_a_config():
  found = config_functions()
  assert len(found) <= MAX_CONFIG_FUNCTIONS, "\n".join(found)


def test_the_config_counter_counts_names_and_annotations(tmp_path):
  path = tmp_path / "planted.py"
  path.write_text(
      "def a(config): pass\n"
      "def b(x: ml_collections.ConfigDict): pass\n"
      "def d(*, c=None): pass\n"
      "def e(settings): pass\n"
  )
  found = config_functions({"planted": str(path)})
  assert found == ["planted.a", "planted.b", "planted.d"]


def passed_on(path: str) -> list[str]:
  """Names a module imports (or binds to another module's attribute,
  ``X = mod.X``) without using them itself: only to pass them on."""
  tree = _tree(path)
  bound: dict[str, int] = {}
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and node.module != "__future__":
      for a in node.names:
        bound[a.asname or a.name] = node.lineno
    elif isinstance(node, ast.Import):
      for a in node.names:
        bound[a.asname or a.name.split(".")[0]] = node.lineno
    elif (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Attribute)
    ):
      root = node.value
      while isinstance(root, ast.Attribute):
        root = root.value
      if isinstance(root, ast.Name) and root.id in bound:
        bound[node.targets[0].id] = node.lineno
  used = {
      n.id
      for n in ast.walk(tree)
      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
  }
  return sorted(
      f"{name} (line {line})"
      for name, line in bound.items()
      if name not in used
  )


def _states_its_api(path: str) -> bool:
  """A package's __init__.py with an ``__all__``."""
  if os.path.basename(path) != "__init__.py":
    return False
  return any(
      isinstance(n, ast.Assign)
      and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
      for n in _tree(path).body
  )


def test_no_module_imports_a_name_only_to_pass_it_on():
  bad = [
      f"{module}: {', '.join(names)}"
      for module, path in sorted(MODULES.items())
      if not _states_its_api(path) and (names := passed_on(path))
  ]
  assert not bad, "\n".join(bad)


def test_the_pass_on_finder_finds_a_planted_facade(tmp_path):
  path = tmp_path / "facade.py"
  path.write_text(
      "from a import used, forwarded\n"
      "import b\n"
      "Alias = b.Thing\n"
      "def f():\n  return used()\n"
  )
  assert passed_on(str(path)) == ["Alias (line 3)", "forwarded (line 1)"]


def test_methods_declare_their_parts_in_one_typed_spec():
  """Every method's package exports ``METHOD = extend.Method(...)`` built
  from real imports, and names no module in a string."""
  methods_dir = os.path.join(PACKAGE, "methods")
  for name in sorted(os.listdir(methods_dir)):
    init = os.path.join(methods_dir, name, "__init__.py")
    if not os.path.isfile(init):
      continue
    tree = _tree(init)
    spec = [
        n
        for n in tree.body
        if isinstance(n, ast.Assign)
        and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["METHOD"]
    ]
    assert spec and ast.unparse(spec[0].value).startswith(
        "extend.Method("
    ), init
    for line, text in _strings(init):
      assert not re.match(r"^memjax\.|^[\w.]+:\w+$", text), (init, line, text)
    declared = {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert not declared & {"REGISTERS", "MODES", "CONFIG"}, init


def _package_of(module: str) -> str:
  """'memjax.<top>' of a module: its top-level module or package."""
  return ".".join(module.split(".")[:2])


def test_no_cycle_among_the_packages():
  """The top-level modules and packages import each other in layers, so
  no import runs back up: no cycle even with each package as one node."""
  graph: dict[str, set[str]] = {}
  for module, targets in _graph().items():
    a = _package_of(module)
    graph.setdefault(a, set())
    for t in targets:
      b = _package_of(t)
      if b != a:
        graph[a].add(b)
        graph.setdefault(b, set())
  assert _cycles(graph) == []


# ----------------------------------------------------------------------------
# Settings read one way; pyink's layout everywhere but tables of numbers
# ----------------------------------------------------------------------------

# The receivers a config or a run's settings go by.
_SETTINGS_NAMES = re.compile(r"(^|[._])(config|cfg|conf|settings)$")
_SETTINGS_OBJECTS = re.compile(r"(^|[._])(config|cfg|conf|settings|s|c)$")


def settings_reads(path: str, sections: set[str]) -> list[str]:
  """Reads of a setting other than the typed object's attributes: the
  settings' ``raw``, ``values(...)`` or ``with_values``, a section read by
  string from a config or settings (``config["loss"]``,
  ``settings.get("data")``), or ``getattr(settings, name)``."""
  out = []
  for n in ast.walk(_tree(path)):
    where = f"{os.path.relpath(path, REPO)}:{getattr(n, 'lineno', 0)}"
    if isinstance(n, ast.Attribute) and n.attr in ("raw", "with_values"):
      out.append(f"{where} .{n.attr}")
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
      if n.func.attr == "values" and (n.args or n.keywords):
        out.append(f"{where} {ast.unparse(n)}")
    receiver, key = None, None
    if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
      receiver, key = n.value, n.slice.value
    elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
      if n.func.attr == "get" and n.args:
        if isinstance(n.args[0], ast.Constant):
          receiver, key = n.func.value, n.args[0].value
    if key in sections and _SETTINGS_NAMES.search(ast.unparse(receiver)):
      out.append(f"{where} {ast.unparse(n)}")
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
      if n.func.id == "getattr" and len(n.args) > 1:
        name = n.args[1]
        named = isinstance(name, ast.Constant) and name.value in sections
        if _SETTINGS_OBJECTS.search(ast.unparse(n.args[0])) and (
            named or not isinstance(name, ast.Constant)
        ):
          out.append(f"{where} {ast.unparse(n)}")
  return out


def _sections() -> set[str]:
  """The config's section names, read from the settings classes' source."""
  out = set()
  for path in MODULES.values():
    for node in ast.walk(_tree(path)):
      if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        if node.target.id == "SECTION" and isinstance(node.value, ast.Constant):
          out.add(node.value.value)
  return out


def test_settings_are_read_one_way_outside_the_settings_package():
  sections = _sections()
  assert {"data", "model", "trime", "eval_memory", "mt_memory"} <= sections
  bad = []
  for module, path in sorted(MODULES.items()):
    if module == "memjax.settings" or module.startswith("memjax.settings."):
      continue
    bad += settings_reads(path, sections)
  assert not bad, "\n".join(bad)


def test_the_settings_read_finder_finds_planted_reads(tmp_path):
  path = tmp_path / "planted.py"
  path.write_text(
      "a = settings.values('eval_memory')\n"
      "b = s.raw['loss']\n"
      "c = config['loss'].memory\n"
      "d = run.settings.get('data')\n"
      "e = getattr(s, section)\n"
      "f = s.with_values('eval', batch_size=2)\n"
      "ok = metrics['loss'] + dict(x).values().__len__() + s.model.d_model\n"
  )
  found = {
      f.split(" ", 1)[1] for f in settings_reads(str(path), {"loss", "data"})
  }
  assert found == {
      "settings.values('eval_memory')",
      ".raw",
      "config['loss']",
      "run.settings.get('data')",
      "getattr(s, section)",
      ".with_values",
  }


# pyink's marker, spelt so that this file holds none itself.
_SKIP = "# fmt: " + "skip"


def _numeric_table(source: str) -> bool:
  """Whether a statement is a table of numbers: 8 numbers or more, and at
  least 40% of its words."""
  words = re.findall(
      r"[A-Za-z_][A-Za-z_0-9]*|\d[\d_.e+-]*|'[^']*'|\"[^\"]*\"", source
  )
  numbers = sum(bool(re.match(r"\d", w)) for w in words)
  return numbers >= 8 and numbers >= 0.4 * len(words)


def layout_skips(path: str) -> list[str]:
  """'path:line' of each pyink skip or off marker whose statement
  is not a table of numbers."""
  text = open(path, encoding="utf-8").read()
  if "fmt: skip" not in text and "fmt: off" not in text:
    return []
  lines = text.splitlines()
  ends: dict[int, ast.stmt] = {}
  for node in ast.walk(ast.parse(text)):
    if isinstance(node, ast.stmt):
      old = ends.get(node.end_lineno)
      if old is None or node.lineno > old.lineno:
        ends[node.end_lineno] = node
  out = []
  with open(path, encoding="utf-8") as f:
    comments = [
        (t.start[0], t.string)
        for t in tokenize.generate_tokens(f.readline)
        if t.type == tokenize.COMMENT
    ]
  for i, comment in comments:
    if "fmt: off" in comment:
      out.append(f"{os.path.relpath(path, REPO)}:{i}")
    elif "fmt: skip" in comment:
      stmt = ends.get(i)
      start = stmt.lineno if stmt else i
      if not _numeric_table("\n".join(lines[start - 1 : i])):
        out.append(f"{os.path.relpath(path, REPO)}:{i}")
  return out


def test_no_layout_skip_outside_tables_of_numbers():
  bad = []
  for top in ("memjax", "tests", "configs", "benchmarks"):
    for root, _, files in os.walk(os.path.join(REPO, top)):
      for f in files:
        if f.endswith(".py"):
          bad += layout_skips(os.path.join(root, f))
  assert not bad, "\n".join(bad)


def test_the_layout_skip_finder_keeps_tables_and_finds_the_rest(tmp_path):
  path = tmp_path / "planted.py"
  path.write_text(
      f"GRID = (\n    0.5, 1, 2, 4, 8, 16, 32, 64,\n)  {_SKIP}\n"
      f"x = f(a, b)  {_SKIP}\n"
  )
  assert [s.rsplit(":", 1)[1] for s in layout_skips(str(path))] == ["4"]
