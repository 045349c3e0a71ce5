"""The dependency locks in requirements/ and setup.py agree.

Every platform's runtime lock is the CPU lock plus that platform's packages
(jax plugins, CUDA libraries, libtpu), the development lock pins the shared
packages at the same versions, and every requirement of setup.py (core and
extras) is met by the locks' pins.
"""

import ast
import os
import re

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests import conftest

LOCKS = ("cpu", "cuda12", "cuda13", "tpu", "dev")
# What each accelerator lock adds to the CPU lock (names, canonical).
PLATFORM_PACKAGES = {
    "cuda12": re.compile(r"^(jax-cuda12-.*|nvidia-.*)$"),
    "cuda13": re.compile(r"^(jax-cuda13-.*|nvidia-.*)$"),
    "tpu": re.compile(r"^libtpu$"),
}


def _lock(name: str) -> dict[str, str]:
  """{canonical package name: pinned version} of requirements/<name>.lock."""
  path = os.path.join(conftest.REPO, "requirements", f"{name}.lock")
  pins = {}
  with open(path) as f:
    for line in f:
      line = line.split("#")[0].strip()
      if not line:
        continue
      package, sep, version = line.partition("==")
      assert sep, f"{name}.lock: {line!r} is not pinned with =="
      key = canonicalize_name(package.split("[")[0])
      assert key not in pins, f"{name}.lock pins {key} twice"
      pins[key] = version
  return pins


def _setup_requirements() -> dict[str, list[str]]:
  """{'': install_requires, extra: [...]} read from setup.py's source."""
  with open(os.path.join(conftest.REPO, "setup.py")) as f:
    tree = ast.parse(f.read())
  call = next(
      n
      for n in ast.walk(tree)
      if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "setup"
  )
  kw = {
      k.arg: ast.literal_eval(k.value)
      for k in call.keywords
      if k.arg in ("install_requires", "extras_require")
  }
  return {"": kw["install_requires"], **kw["extras_require"]}


def test_locks_agree_on_every_shared_package():
  locks = {name: _lock(name) for name in LOCKS}
  for a in LOCKS:
    for b in LOCKS:
      shared = set(locks[a]) & set(locks[b])
      differ = {
          p: (locks[a][p], locks[b][p])
          for p in shared
          if locks[a][p] != locks[b][p]
      }
      assert not differ, f"{a}.lock and {b}.lock differ: {differ}"


def test_accelerator_locks_are_the_cpu_lock_plus_their_platform():
  cpu = _lock("cpu")
  for name, pattern in PLATFORM_PACKAGES.items():
    lock = _lock(name)
    assert set(cpu) <= set(lock), f"{name}.lock lacks {set(cpu) - set(lock)}"
    added = set(lock) - set(cpu)
    assert added and all(pattern.match(p) for p in added), (name, added)
  assert "jaxlib" in cpu and "jax-cuda12-plugin" not in cpu


def test_setup_requirements_are_met_by_the_locks():
  locks = {name: _lock(name) for name in LOCKS}
  lock_of = {
      "": "cpu",
      "data": "cpu",
      "beam": "cpu",
      "retrieval": "cpu",
      "cloud": "cpu",
      "pretrained": "cpu",
      "cuda12": "cuda12",
      "cuda13": "cuda13",
      "tpu": "tpu",
      "dev": "dev",
      "notebooks": "dev",
  }
  requirements = _setup_requirements()
  assert set(requirements) == set(lock_of), "an extra without a lock"
  for extra, reqs in requirements.items():
    pins = locks[lock_of[extra]]
    for text in reqs:
      req = Requirement(text)
      name = canonicalize_name(req.name)
      assert name in pins, f"{text} ([{extra}]) is in no lock"
      assert req.specifier.contains(
          Version(pins[name]), prereleases=True
      ), f"{text} ([{extra}]) is not met by {name}=={pins[name]}"


def test_the_core_pins_no_heavy_package():
  # The core's own requirements pull in none of the optional packages.
  core = {
      canonicalize_name(Requirement(r).name) for r in _setup_requirements()[""]
  }
  assert not core & {
      "tensorflow",
      "seqio",
      "scann",
      "tensorflow-text",
      "safetensors",
      "tokenizers",
  }


def _read(*parts: str) -> str:
  with open(os.path.join(conftest.REPO, *parts)) as f:
    return f.read()


def test_the_supported_pythons_are_stated_alike_everywhere():
  # setup.py's python_requires, the Makefile's check, the versions the
  # locks are resolved and checked for, and docs/hardware.md.
  setup = _read("setup.py")
  assert 'python_requires=">=3.11,<3.14"' in setup
  assert "(3, 11) <= sys.version_info[:2] <= (3, 13)" in _read("Makefile")
  compile_sh = _read("requirements", "compile.sh")
  assert "OLDEST=3.11" in compile_sh and "NEWER=(3.12 3.13)" in compile_sh
  assert "Python 3.11 to 3.13" in _read("docs", "hardware.md")


def test_jax_and_its_libraries_have_a_tested_range():
  # Each is bounded above (raised once a newer release passes `make
  # test-newest`) and its lower bound is the locks' pin, the version the
  # suite runs on.
  cpu = _lock("cpu")
  for text in _setup_requirements()[""]:
    req = Requirement(text)
    name = canonicalize_name(req.name)
    if name not in ("jax", "flax", "optax", "orbax-checkpoint"):
      continue
    lower = [s.version for s in req.specifier if s.operator == ">="]
    upper = [s.version for s in req.specifier if s.operator == "<"]
    assert lower == [cpu[name]], text
    assert len(upper) == 1, f"{text} has no upper bound"


def test_the_stock_image_recipe_installs_every_core_requirement():
  # What docs/hardware.md adds to a stock JAX image is the list `make
  # venv-newest` installs, and with what the image has (and brings along)
  # it covers the core's requirements.
  listed = [
      line.strip()
      for line in _read("requirements", "stock-image.txt").splitlines()
      if line.strip() and not line.startswith("#")
  ]
  assert f"pip install {' '.join(listed)}" in _read("docs", "hardware.md")
  image = {"jax", "flax", "optax", "orbax-checkpoint"}
  # Brought by the image's packages: absl-py (orbax-checkpoint), etils
  # (orbax-checkpoint), numpy (jax).
  brought = {"absl-py", "etils", "numpy"}
  core = {
      canonicalize_name(Requirement(r).name) for r in _setup_requirements()[""]
  }
  have = image | brought | {canonicalize_name(n) for n in listed}
  assert core <= have, f"the stock image recipe lacks {core - have}"
