"""Test set-up: eight fake CPU devices, so sharding tests can build meshes.

The flag must be set before jax is imported anywhere in the test process.
"""

import os

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
