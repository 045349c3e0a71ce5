"""Every notebook under colabs/ runs headless, on the shared smoke run.

Each notebook runs in a fresh IPython kernel of this interpreter, with

* its directory ``colabs/`` and no ``MEMJAX_ROOT``: the set-up cell finds
  the checkout above it and puts it on ``sys.path``;
* ``MEMJAX_OUT``: where the notebook writes (exports and the like);
* the variables of ``SHARED_RUNS`` a notebook names, which notebooks reuse
  instead of training their own, e.g. ``MEMJAX_SMOKE_RUN``: the session's
  smoke run, ``MEMJAX_RESM_RUN``: a residual-memory smoke run,
  ``MEMJAX_BERT_CLS_RUN``: a fine-tuned BERT-style ResM encoder.

A failing cell fails the test with that cell's number, source and traceback.
"""

import ast
import glob
import os
import re
import shutil
import subprocess
import sys

import nbclient
from nbclient import exceptions
import nbformat
from jupyter_client import kernelspec
from jupyter_client import manager
import pytest

from colabs import set_repository
from memjax.io import optional
from tests.conftest import REPO
from tests.conftest import xla_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "colabs", "*.ipynb")))
CELL_TIMEOUT_S = 600
STARTUP_TIMEOUT_S = 180
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Colours of IPython's tracebacks.

# Further shared runs a notebook may reuse: environment variable -> fixture.
# A notebook that names the variable gets the fixture's run.
SHARED_RUNS = {
    "MEMJAX_SMOKE_RUN": "smoke_workdir",
    "MEMJAX_RESM_RUN": "resm_smoke_workdir",
    "MEMJAX_MT_RUN": "mt_smoke_workdir",
    "MEMJAX_MARGE_RUN": "marge_smoke_workdir",
    "MEMJAX_BERT_CLS_RUN": "bert_cls_smoke_workdir",
    "MEMJAX_LAMEMO_RUN": "lamemo_smoke_workdir",
}


def _kernel_manager() -> manager.AsyncKernelManager:
  # No kernel directories: "python3" resolves to ipykernel's built-in spec,
  # which runs this interpreter (sys.executable), whatever kernelspecs the
  # machine or the user has installed.
  specs = kernelspec.KernelSpecManager(kernel_dirs=[])
  return manager.AsyncKernelManager(
      kernel_name="python3", kernel_spec_manager=specs
  )


def _env(**overrides: str | None) -> dict[str, str]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = xla_flags(1)  # One device, as in Colab or on a laptop.
  for key in (
      "MEMJAX_ROOT",
      "MEMJAX_OUT",
      "MEMJAX_REPO",
      "MEMJAX_CLONE",
      "MEMJAX_PIP_DRY_RUN",
      *SHARED_RUNS,
  ):
    env.pop(key, None)
  env.update({k: v for k, v in overrides.items() if v is not None})
  return env


def _execute(nb: nbformat.NotebookNode, name: str, cwd: str, env) -> None:
  """Executes ``nb`` in place; fails the test with the failing cell."""
  client = nbclient.NotebookClient(
      nb,
      km=_kernel_manager(),
      timeout=CELL_TIMEOUT_S,
      startup_timeout=STARTUP_TIMEOUT_S,
      resources={"metadata": {"path": cwd}},
  )
  try:
    client.execute(env=env)
    return
  except (
      exceptions.CellExecutionError,
      exceptions.CellTimeoutError,
      exceptions.DeadKernelError,
  ) as e:
    error = _ANSI.sub("", str(e))
  failed = [
      i
      for i, cell in enumerate(nb.cells)
      if any(o.get("output_type") == "error" for o in cell.get("outputs", []))
  ]
  where = f"cell {failed[0]}" if failed else "a cell"
  pytest.fail(f"{name}: {where} failed: {error}", pytrace=False)


def _read(path: str) -> nbformat.NotebookNode:
  return nbformat.read(path, as_version=nbformat.NO_CONVERT)


def test_there_are_notebooks():
  assert NOTEBOOKS


SETUP_CELL = os.path.join(REPO, "colabs", "setup_cell.py")


def test_every_notebook_starts_with_the_one_set_up_cell():
  # The set-up code has one home, colabs/setup_cell.py, copied into each
  # notebook by colabs/set_repository.py.
  with open(SETUP_CELL, encoding="utf-8") as f:
    cell = f.read()
  assert cell.count("MEMJAX_REPO', '") == 1
  for path in NOTEBOOKS:
    assert "".join(_read(path).cells[1].source).startswith(cell), path


def _named_repository(root) -> dict[str, str]:
  """Where the repository URL is written under ``root``: what each names."""
  root = str(root)
  named = {"setup.py": set_repository.read_repository(root)}
  with open(os.path.join(root, "CITATION.cff"), encoding="utf-8") as f:
    named["CITATION.cff"] = re.search(
        r'^repository-code: "([^"]*)"$', f.read(), re.MULTILINE
    ).group(1)
  with open(
      os.path.join(root, "colabs", "setup_cell.py"), encoding="utf-8"
  ) as f:
    clone = re.search(r"'MEMJAX_REPO', '([^']*)'", f.read()).group(1)
  named["setup_cell.py"] = clone.removesuffix(".git")
  for path in sorted(glob.glob(os.path.join(root, "colabs", "*.ipynb"))):
    first = _read(path).cells[0].source.split("\n")[0]
    link = re.fullmatch(
        r"\[!\[Open In Colab\]\([^)]*\)\]\(https://colab\.research\.google"
        r"\.com/github/([^/]+/[^/]+)/blob/[^/]+/colabs/([^)]+)\)",
        first,
    )
    assert link, f"{path}: no Open in Colab badge first: {first!r}"
    assert link.group(2) == os.path.basename(path), first
    named[os.path.basename(path)] = f"https://github.com/{link.group(1)}"
  return named


def test_the_repository_url_is_set_once_and_everything_names_it():
  named = _named_repository(REPO)
  assert len(named) == 3 + len(NOTEBOOKS)
  assert set(named.values()) == {named["setup.py"]}, named


def test_set_repository_writes_the_url_everywhere(tmp_path):
  colabs = tmp_path / "colabs"
  shutil.copytree(os.path.join(REPO, "colabs"), colabs)
  for name in ("setup.py", "CITATION.cff"):
    shutil.copy(os.path.join(REPO, name), tmp_path / name)
  script = [sys.executable, str(colabs / "set_repository.py")]

  def run(*args):
    return subprocess.run(
        script + list(args), capture_output=True, text=True, check=False
    )

  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  bad = run("https://example.org/fork/memjax.git")
  assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
  assert bad.stderr.startswith("memjax: error: ") and "GitHub" in bad.stderr
  assert {p: p.read_bytes() for p in before} == before  # nothing written
  assert run("https://github.com/fork/memjax.git").returncode == 0
  named = _named_repository(tmp_path)
  assert set(named.values()) == {"https://github.com/fork/memjax"}, named
  cell = (colabs / "setup_cell.py").read_text(encoding="utf-8")
  assert "'MEMJAX_REPO', 'https://github.com/fork/memjax.git'" in cell
  for path in sorted(colabs.glob("*.ipynb")):
    nb = _read(str(path))
    assert "".join(nb.cells[1].source).startswith(cell), path
    # The rest of the notebook is as it was, the badge and set-up aside.
    was = _read(os.path.join(REPO, "colabs", path.name))
    assert nb.cells[0].source.split("\n", 1)[1] == (
        was.cells[0].source.split("\n", 1)[1]
    )
    assert [c.source for c in nb.cells[2:]] == [c.source for c in was.cells[2:]]
  # Edited in setup.py alone, then copied from there.
  setup = tmp_path / "setup.py"
  setup.write_text(
      setup.read_text().replace("github.com/fork/", "github.com/other/")
  )
  assert run().returncode == 0
  assert set(_named_repository(tmp_path).values()) == {
      "https://github.com/other/memjax"
  }


_AS_COLAB = (
    "import importlib.util, sys, types\n"
    "sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
    "find = importlib.util.find_spec\n"
    "importlib.util.find_spec = (\n"
    "    lambda n, *a: None if n == 'memjax' else find(n, *a))\n"
)
# A notebook's own lines after the set-up and its install.
_SETUP_ENDS = "# Where this notebook writes"


def _as_colab(code: str, cwd, **env: str) -> subprocess.CompletedProcess:
  """Runs ``code`` as Colab would (google.colab imported, memjax not
  installed) in ``cwd``, outside any checkout."""
  script = cwd / "cell.py"
  script.write_text(_AS_COLAB + code, encoding="utf-8")
  return subprocess.run(
      [sys.executable, str(script)],
      cwd=cwd,
      env=_env(**env),
      capture_output=True,
      text=True,
      timeout=120,
  )


def test_the_set_up_cell_in_colab_clones_and_installs_without_jax(tmp_path):
  """A notebook's set-up cell as Colab runs it, cloning from a local clone
  (this checkout's committed state), then installing the core and the
  notebook's extras; pip runs dry."""
  clone = tmp_path / "content" / "memjax"
  source = "".join(
      _read(os.path.join(REPO, "colabs", "external_memory.ipynb"))
      .cells[1]
      .source
  )
  proc = _as_colab(
      source[: source.index(_SETUP_ENDS)]
      + "import memjax\n"
      + "print('ROOT', ROOT, os.getcwd(), memjax.__file__)\n",
      tmp_path,
      MEMJAX_REPO=REPO,
      MEMJAX_CLONE=str(clone),
      MEMJAX_PIP_DRY_RUN="1",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (clone / ".git").is_dir() and (clone / "setup.py").is_file()
  lines = proc.stdout.splitlines()
  root_line = next(l for l in lines if l.startswith("ROOT ")).split()
  assert root_line[1:] == [
      str(clone),
      str(clone),
      str(clone / "memjax" / "__init__.py"),
  ]
  pip = [l for l in lines if l.startswith("$ ")]
  # This environment has every requirement of the core, [data] and
  # [retrieval]: memjax alone, no dependencies.
  assert pip == [f"$ pip install -q --no-deps -e {clone}"], lines


def test_the_placeholder_url_is_one_line_naming_the_fix(tmp_path):
  clone = tmp_path / "content" / "memjax"
  with open(SETUP_CELL, encoding="utf-8") as f:
    cell = f.read()
  proc = _as_colab(cell, tmp_path, MEMJAX_CLONE=str(clone))
  assert proc.returncode == 1 and not clone.exists()
  line = proc.stderr.strip()
  assert line.startswith("memjax: error: ") and "\n" not in line, line
  assert "<owner>" in line and "colabs/set_repository.py https://" in line


def _declared_extras(path: str) -> list[str]:
  """The extras a notebook's set-up cell installs (``colab.install(ROOT,
  extras=[...])``)."""
  tree = ast.parse("".join(_read(path).cells[1].source))
  for node in ast.walk(tree):
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "install"
        and ast.unparse(node.func.value) == "colab"
    ):
      for k in node.keywords:
        if k.arg == "extras":
          return list(ast.literal_eval(k.value))
      return []
  raise AssertionError(f"{path}: its set-up cell calls no colab.install")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_a_notebook_that_trains_installs_the_tokeniser_extra(path):
  # Training from the shipped raw text tokenises it first (SeqIO); Colab
  # has no token cache. The extras the modes import are checked where the
  # notebook runs (test_notebook_runs).
  from colabs import colab  # pylint: disable=g-import-not-at-top

  extras = _declared_extras(path)
  colab.requirements(REPO, extras)  # each one is an extra of setup.py
  code = "".join(
      c.source for c in _read(path).cells[2:] if c.cell_type == "code"
  )
  if "memjax.train(" in code:
    assert optional.PACKAGES["seqio"][1] in extras, (path, extras)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, request):
  """The notebook runs in a kernel started in colabs/ without MEMJAX_ROOT.

  The set-up cell finds the checkout above the kernel's directory and puts
  it, not another installed memjax, first on ``sys.path`` (a last cell
  prints what was imported); the notebook writes only under MEMJAX_OUT.
  """
  nb = _read(path)
  out = tmp_path / "out"
  out.mkdir()
  source = "".join(c.source for c in nb.cells)
  runs = {
      var: request.getfixturevalue(fixture)
      for var, fixture in SHARED_RUNS.items()
      if var in source
  }
  check = nbformat.v4.new_code_cell(
      "import configs, memjax\n"
      "from memjax.io import optional as _optional\n"
      "print(ROOT, os.path.dirname(memjax.__path__[0]), sys.executable)\n"
      "print(*sorted({e for m, (_, e) in _optional.PACKAGES.items()\n"
      "               if m in sys.modules}))"
  )
  nb.cells.append(check)
  colabs = os.path.join(REPO, "colabs")
  before = sorted(os.listdir(colabs))
  _execute(
      nb, os.path.basename(path), colabs, _env(MEMJAX_OUT=str(out), **runs)
  )
  text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
  where, imported = text.split("\n", 1)
  assert where.split() == [REPO, REPO, sys.executable], text
  # Every extra whose packages the cells imported is one the notebook's
  # set-up cell installs in Colab (optional.PACKAGES: package -> extra).
  assert set(imported.split()) <= set(_declared_extras(path)), text
  assert sorted(os.listdir(colabs)) == before  # Nothing written beside it.
