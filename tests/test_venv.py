"""`make venv` needs Python 3.11: another version (a TPU VM's 3.10) or a
missing interpreter is one line saying what to install, before anything is
made."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _fake_python(path, version: str) -> str:
  """An interpreter that answers the Makefile's version check as Python
  ``version`` would and stops where a venv would be made."""
  major, minor = version.split(".")
  path.write_text(
      "#!/bin/sh\n"
      'if [ "$1" = "-c" ]; then\n'
      f"  exec {sys.executable} -c "
      f'"import sys; sys.version_info = ({major}, {minor}, 0); $2"\n'
      "fi\n"
      "echo MAKING_THE_VENV >&2\n"
      "exit 3\n"
  )
  path.chmod(0o755)
  return str(path)


def _make_venv(tmp_path, python: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [
          "make",
          "-s",
          "venv",
          "ACCEL=tpu",
          f"VENV={tmp_path / 'venv'}",
          f"PYTHON={python}",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=60,
      check=False,
  )


@pytest.mark.parametrize("python", ["3.10", "missing"])
def test_another_python_is_one_line_naming_the_fix(tmp_path, python):
  if python == "missing":
    exe = str(tmp_path / "no" / "python3.11")
  else:
    exe = _fake_python(tmp_path / "python3.10", python)
  proc = _make_venv(tmp_path, exe)
  assert proc.returncode != 0
  ours = [l for l in proc.stderr.splitlines() if not l.startswith("make")]
  assert len(ours) == 1 and ours[0].startswith("memjax: error: "), proc.stderr
  assert exe in ours[0] and "python3.11 python3.11-venv" in ours[0]
  assert "MAKING_THE_VENV" not in proc.stderr
  assert not os.path.exists(tmp_path / "venv")


def test_python_3_11_goes_on_to_make_the_venv(tmp_path):
  proc = _make_venv(tmp_path, _fake_python(tmp_path / "python3.11", "3.11"))
  assert "MAKING_THE_VENV" in proc.stderr and "memjax:" not in proc.stderr
