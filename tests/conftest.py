"""Test set-up: eight fake CPU devices, and one smoke run shared by tests.

The flag must be set before jax is imported anywhere in the test process.
"""

import os
import subprocess
import sys

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Reuse compiled XLA programs across test processes (the end-to-end tests run
# memjax.main in subprocesses that compile the same programs).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(__file__), "..", ".cache", "xla"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def smoke_workdir(tmp_path_factory) -> str:
  """A finished run of configs/trime_wt103.py:smoke, made once per session.

  Trained by ``python -m memjax.main`` in a subprocess on one CPU device, as
  on a user's laptop. Tests that share it must not change it; the run's
  output is in ``main.log`` next to the workdir.
  """
  base = tmp_path_factory.mktemp("smoke")
  workdir = str(base / "workdir")
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # One device, not the tests' eight.
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "memjax.main",
          "--config=configs/trime_wt103.py:smoke",
          f"--workdir={workdir}",
      ],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=900,
  )
  (base / "main.log").write_text(proc.stdout + proc.stderr)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir
