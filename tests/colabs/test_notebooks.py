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

import glob
import os
import re
import sys

import nbclient
from nbclient import exceptions
import nbformat
from jupyter_client import kernelspec
from jupyter_client import manager
import pytest

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
  for key in ("MEMJAX_ROOT", "MEMJAX_OUT", *SHARED_RUNS):
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
  # The repository URL has one home, colabs/setup_cell.py, copied into each
  # notebook by colabs/set_repository.py.
  with open(SETUP_CELL, encoding="utf-8") as f:
    cell = f.read()
  assert cell.count("MEMJAX_REPO', '") == 1
  for path in NOTEBOOKS:
    assert "".join(_read(path).cells[1].source).startswith(cell), path


def test_set_repository_writes_the_url_everywhere(tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top

  colabs = tmp_path / "colabs"
  shutil.copytree(os.path.join(REPO, "colabs"), colabs)
  url = "https://example.org/fork/memjax.git"
  subprocess.run(
      [sys.executable, str(colabs / "set_repository.py"), url], check=True
  )
  cell = (colabs / "setup_cell.py").read_text(encoding="utf-8")
  assert f"'MEMJAX_REPO', {url!r}" in cell
  for path in sorted(colabs.glob("*.ipynb")):
    nb = _read(str(path))
    assert "".join(nb.cells[1].source).startswith(cell), path
    # The rest of the notebook is as it was.
    before = _read(os.path.join(REPO, "colabs", path.name))
    assert [c.source for c in nb.cells[2:]] == [
        c.source for c in before.cells[2:]
    ]


def test_the_set_up_cell_in_colab_clones_and_installs_without_jax(tmp_path):
  """The set-up cell as Colab runs it (google.colab imported, memjax not
  installed, the kernel outside any checkout), cloning from a local clone
  (this checkout's committed state); pip runs dry."""
  import subprocess  # pylint: disable=g-import-not-at-top

  clone = tmp_path / "content" / "memjax"
  run = (
      "import importlib.util, sys, types\n"
      "sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
      "find = importlib.util.find_spec\n"
      "importlib.util.find_spec = (\n"
      "    lambda n, *a: None if n == 'memjax' else find(n, *a))\n"
      f"exec(open({SETUP_CELL!r}).read())\n"
      "import memjax\n"
      "print('ROOT', ROOT, os.getcwd(), memjax.__file__)\n"
  )
  env = _env(MEMJAX_REPO=REPO, MEMJAX_CLONE=str(clone), MEMJAX_PIP_DRY_RUN="1")
  proc = subprocess.run(
      [sys.executable, "-c", run], cwd=tmp_path, env=env,
      capture_output=True, text=True, timeout=120,
  )  # fmt: skip
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
  # This environment has every requirement: memjax alone, no dependencies.
  assert pip == [f"$ pip install -q --no-deps -e {clone}"], lines


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
      "print(ROOT, os.path.dirname(memjax.__path__[0]), sys.executable)"
  )
  nb.cells.append(check)
  colabs = os.path.join(REPO, "colabs")
  before = sorted(os.listdir(colabs))
  _execute(
      nb, os.path.basename(path), colabs, _env(MEMJAX_OUT=str(out), **runs)
  )
  text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
  assert text.split() == [REPO, REPO, sys.executable], text
  assert sorted(os.listdir(colabs)) == before  # Nothing written beside it.
