"""`make venv` takes Python 3.11 to 3.13: another version (a TPU VM's 3.10)
or a missing interpreter is one line saying what to install, before anything
is made; a venv already made by another Python than the one named is one
line too, and stays as it was."""

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


def _make_venv(
    tmp_path, python: str, venv: str = "venv"
) -> subprocess.CompletedProcess:
  return subprocess.run(
      [
          "make",
          "-s",
          "venv",
          "ACCEL=tpu",
          f"VENV={tmp_path / venv}",
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
  assert exe in ours[0] and "not Python 3.11 to 3.13" in ours[0]
  assert "python3.11 python3.11-venv" in ours[0]
  assert "MAKING_THE_VENV" not in proc.stderr
  assert not os.path.exists(tmp_path / "venv")


@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_a_supported_python_goes_on_to_make_the_venv(tmp_path, version):
  proc = _make_venv(tmp_path, _fake_python(tmp_path / "python", version))
  assert "MAKING_THE_VENV" in proc.stderr and "memjax:" not in proc.stderr


def test_a_venv_of_another_python_is_refused_and_kept(tmp_path):
  # A venv made by 3.11 earlier, and its stamp: naming 3.12 used to be a
  # silent no-op that kept 3.11.
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  _fake_python(venv / "bin" / "python", "3.11")
  (venv / ".installed-tpu").touch()
  before = sorted(p.name for p in venv.rglob("*"))
  want = _fake_python(tmp_path / "python3.12", "3.12")
  proc = _make_venv(tmp_path, want)
  assert proc.returncode == 2
  ours = [l for l in proc.stderr.splitlines() if not l.startswith("make")]
  assert len(ours) == 1 and ours[0].startswith("memjax: error: "), proc.stderr
  assert "is Python 3.11, not" in ours[0] and "3.12" in ours[0]
  assert "VENV=.venv-3.12" in ours[0] and "make clean-venv" in ours[0]
  assert "MAKING_THE_VENV" not in proc.stderr
  assert sorted(p.name for p in venv.rglob("*")) == before
  # The same Python as the venv's goes on (nothing to install: up to date).
  same = _make_venv(tmp_path, _fake_python(tmp_path / "python3.11", "3.11"))
  assert "memjax:" not in same.stderr, same.stderr
