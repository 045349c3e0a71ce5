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
