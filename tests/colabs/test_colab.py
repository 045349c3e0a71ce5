"""colabs.colab: what a hosted notebook installs."""

import sys

import pytest

from colabs import colab
from tests.conftest import REPO


def test_requirements_are_read_from_setup_py_without_running_it(tmp_path):
  (tmp_path / "setup.py").write_text(
      "raise SystemExit('not run')\n"
      "setup(name='x', install_requires=['jax>=0.5', 'etils[epath]>=1.7'])\n"
  )
  assert colab.requirements(str(tmp_path)) == ["jax>=0.5", "etils[epath]>=1.7"]
  assert any(r.startswith("flax>=") for r in colab.requirements(REPO))


def test_an_extra_adds_its_requirements_once(tmp_path):
  (tmp_path / "setup.py").write_text(
      "setup(install_requires=['jax>=0.5'],\n"
      "      extras_require={'data': ['seqio', 'jax>=0.5'], 'x': ['scann']})\n"
  )
  root = str(tmp_path)
  assert colab.requirements(root, ["data"]) == ["jax>=0.5", "seqio"]
  assert colab.requirements(root, ["data", "x"]) == [
      "jax>=0.5",
      "seqio",
      "scann",
  ]
  with pytest.raises(ValueError, match="no extra 'nope'"):
    colab.requirements(root, ["nope"])
  assert "scann==1.4.2" in colab.requirements(REPO, ["retrieval"])


def test_only_missing_distributions_are_installed(tmp_path):
  assert colab.distribution("etils[epath]>=1.7") == "etils"
  assert colab.distribution("ml_collections>=0.1.1") == "ml_collections"
  # Installed here at any version (the runtime's own jax is kept).
  assert colab.missing(["jax>=999", "numpy"]) == []
  assert colab.missing(["jax", "surely-not-a-package-xyz>=1"]) == [
      "surely-not-a-package-xyz>=1"
  ]
  (tmp_path / "setup.py").write_text(
      "setup(install_requires=['jax>=0.5', 'surely-not-a-package-xyz'],\n"
      "      extras_require={'e': ['numpy', 'surely-not-an-extra-xyz']})\n"
  )
  commands = colab.install(str(tmp_path), dry_run=True)
  pip = [sys.executable, "-m", "pip", "install", "-q"]
  assert commands == [
      pip + ["surely-not-a-package-xyz"],
      pip + ["--no-deps", "-e", str(tmp_path)],
  ]
  assert colab.install(str(tmp_path), ["e"], dry_run=True)[0] == pip + [
      "surely-not-a-package-xyz",
      "surely-not-an-extra-xyz",
  ]
  # This checkout in this environment: memjax only, no lock, no jax.
  assert colab.install(REPO, dry_run=True) == [pip + ["--no-deps", "-e", REPO]]
