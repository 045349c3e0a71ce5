"""Accelerators ``--mode=plan`` plans for, and its device set-up.

Nothing here imports JAX: ``memjax.main`` calls ``set_device_flags`` before
the first ``import jax``, because XLA reads the fake CPU device count
(``--xla_force_host_platform_device_count``) once, when its CPU backend
starts.

Peak FLOP/s are dense (no structured sparsity) per device as JAX sees it: a
TPU v4 or v5p chip (its two TensorCores form one megacore device), a TPU
v5e chip, one GPU. The float32 column is what JAX's default matmul precision
runs float32 products at: on TPUs one bfloat16 pass of the MXU (so the
bfloat16 peak; no float32 figure is published), on NVIDIA GPUs TF32 tensor
cores.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import ClassVar

from memjax import errors
from memjax import settings as settings_lib
from memjax.settings import sections


@dataclasses.dataclass(frozen=True)
class Plan:
  """``config.plan``: --mode=plan compiles the train step for a target
  without running it (docs/plan.md).

  Attributes:
    devices: devices planned for; 0 = the chips of a Cloud TPU slice name,
      else those the mesh names.
    platform: tpu_v4 | tpu_v5e | tpu_v5p | h100 | h200 | a100 | cpu, or a
      Cloud TPU slice name (v4-8, v5litepod-8, v5p-128: its chips).
    tpu_topology: compile TPU platforms against a libtpu topology when
      libtpu is installed (else on fake CPU devices, as estimates).
    tpu_shape: e.g. "4x8x8"; '' = the standard slice of ``devices``.
    vocab_size: V of the planned model; 0 = the config's or the corpus's
      published vocabulary.
    utilization: share of the peak FLOP/s for the step time.
    memory_fraction: usable share of memory; 0 = the platform's.
    dtypes: the compute dtypes planned.
    fit_batch: also compile a micro-batch twice as large.
    eval_step: also compile the evaluation step (the scorer's forward).
    buffers: list this many of the largest buffers of each dtype's train
      step, from the compiler's buffer assignment (``plan_buffers``); 0 =
      none.
  """

  SECTION: ClassVar[str] = "plan"
  devices: int = 0
  platform: str = "cpu"
  tpu_topology: bool = True
  tpu_shape: str = ""
  vocab_size: int = 0
  utilization: float = 0.4
  memory_fraction: float = 0.0
  dtypes: tuple[str, ...] = ("float32", "bfloat16")
  fit_batch: bool = True
  eval_step: bool = True
  buffers: int = sections.ranged(0, sections.NON_NEGATIVE)


TFLOPS = 1e12
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Platform:
  """One kind of device.

  Attributes:
    name: the ``plan.platform`` value.
    peak_bf16: dense bfloat16 FLOP/s per device.
    peak_fp32: FLOP/s of float32 matmuls at JAX's default precision.
    memory: device memory in bytes.
    memory_fraction: the share of ``memory`` a run may use by default.
    topology: 'tpu_v4'-style name of the libtpu topology ('v4', 'v5e',
      'v5p'), '' for platforms compiled on fake CPU devices.
    source: where the numbers come from.
  """

  name: str
  peak_bf16: float
  peak_fp32: float
  memory: float
  memory_fraction: float
  topology: str
  source: str


# JAX on GPUs preallocates 75% of the memory (XLA_PYTHON_CLIENT_MEM_FRACTION,
# https://docs.jax.dev/en/latest/gpu_memory_allocation.html); on TPUs XLA
# owns the HBM, less a few percent for the runtime.
_GPU_FRACTION, _TPU_FRACTION = 0.75, 0.95

PLATFORMS: dict[str, Platform] = {
    # 275 TFLOP/s bf16 and 32 GiB HBM per chip:
    # https://cloud.google.com/tpu/docs/v4
    "tpu_v4": Platform(
        "tpu_v4",
        275 * TFLOPS,
        275 * TFLOPS,
        32 * GIB,
        _TPU_FRACTION,
        "v4",
        "cloud.google.com/tpu/docs/v4",
    ),
    # 197 TFLOP/s bf16 and 16 GiB HBM per chip:
    # https://cloud.google.com/tpu/docs/v5e
    "tpu_v5e": Platform(
        "tpu_v5e",
        197 * TFLOPS,
        197 * TFLOPS,
        16 * GIB,
        _TPU_FRACTION,
        "v5e",
        "cloud.google.com/tpu/docs/v5e",
    ),
    # 459 TFLOP/s bf16 and 95 GiB HBM per chip:
    # https://cloud.google.com/tpu/docs/v5p
    "tpu_v5p": Platform(
        "tpu_v5p",
        459 * TFLOPS,
        459 * TFLOPS,
        95 * GIB,
        _TPU_FRACTION,
        "v5p",
        "cloud.google.com/tpu/docs/v5p",
    ),
    # H100 SXM5: 989.4 TFLOP/s bf16 and 494.7 TF32 dense (the datasheet's
    # 1,979 / 989 are with sparsity), 80 GB HBM3:
    # https://www.nvidia.com/en-us/data-center/h100/ and the H100 whitepaper
    # (resources.nvidia.com/en-us-tensor-core), table 3.
    "h100": Platform(
        "h100",
        989.4 * TFLOPS,
        494.7 * TFLOPS,
        80 * GIB,
        _GPU_FRACTION,
        "",
        "nvidia.com/en-us/data-center/h100 (SXM5, dense)",
    ),
    # H200 SXM: the H100's tensor cores, 141 GB HBM3e:
    # https://www.nvidia.com/en-us/data-center/h200/
    "h200": Platform(
        "h200",
        989.4 * TFLOPS,
        494.7 * TFLOPS,
        141e9,
        _GPU_FRACTION,
        "",
        "nvidia.com/en-us/data-center/h200 (SXM, dense)",
    ),
    # A100 SXM4 80GB: 312 TFLOP/s bf16 and 156 TF32 dense, 80 GB HBM2e:
    # https://www.nvidia.com/en-us/data-center/a100/ (datasheet, dense).
    "a100": Platform(
        "a100",
        312 * TFLOPS,
        156 * TFLOPS,
        80 * GIB,
        _GPU_FRACTION,
        "",
        "nvidia.com/en-us/data-center/a100 (SXM4 80GB, dense)",
    ),
    # One x86 core with two AVX2 FMA units at 3 GHz: 2 units x 8 float32
    # lanes x 2 FLOPs x 3e9 = 96 GFLOP/s (bfloat16 is converted, no faster);
    # the memory is 4 GiB per fake device, a nominal share of a host.
    "cpu": Platform(
        "cpu",
        96e9,
        96e9,
        4 * GIB,
        0.9,
        "",
        "nominal AVX2 core: 2 FMA units x 8 lanes x 2 FLOPs x 3 GHz",
    ),
}


# Cloud TPU's slice names: '<version>-<n>'. v4 and v5p names count
# TensorCores, two per chip (a v4-8 is 4 chips); v5e names count chips
# (a v5litepod-8 is 8). https://cloud.google.com/tpu/docs/v4,
# https://cloud.google.com/tpu/docs/v5p, https://cloud.google.com/tpu/docs/v5e
CLOUD_TPU = {
    "v4": ("tpu_v4", 2),
    "v5p": ("tpu_v5p", 2),
    "v5litepod": ("tpu_v5e", 1),
}
_CLOUD_NAME = re.compile(r"^(v4|v5p|v5litepod)-(\d+)$")


def cloud_tpu(name: str) -> tuple[str, int] | None:
  """(platform, chips) of a Cloud TPU slice name such as 'v4-8', else None.

  Raises:
    errors.ConfigError: a core count that is no whole number of chips.
  """
  match = _CLOUD_NAME.match(name)
  if not match:
    return None
  platform, cores_per_chip = CLOUD_TPU[match.group(1)]
  cores = int(match.group(2))
  if cores < cores_per_chip or cores % cores_per_chip:
    raise errors.ConfigError(
        f"plan.platform {name!r}: {match.group(1)} slice names count "
        f"TensorCores, {cores_per_chip} per chip; use e.g. "
        f"{match.group(1)}-{4 * cores_per_chip}"
    )
  return platform, cores // cores_per_chip


def get(name: str) -> Platform:
  """The platform named by ``plan.platform`` (a ``PLATFORMS`` key or a
  Cloud TPU slice name; ConfigError listing them)."""
  cloud = cloud_tpu(name)
  if cloud is not None:
    return PLATFORMS[cloud[0]]
  if name not in PLATFORMS:
    raise errors.ConfigError(
        f"plan.platform {name!r} is not known; use one of "
        f"{', '.join(PLATFORMS)}, or a Cloud TPU slice name "
        "(v4-8, v5litepod-8, v5p-128)"
    )
  return PLATFORMS[name]


def describe(s: settings_lib.Settings) -> str:
  """What the plan's target is, in words: a Cloud TPU name explained
  ('v4-8: 4 TPU v4 chips (v4 names count TensorCores, 2 per chip)')."""
  name = str(s.of(Plan).platform)
  cloud = cloud_tpu(name)
  n = planned_devices(s)
  if cloud is None:
    return f"{n} {get(name).name}"
  version = name.split("-")[0]
  per_chip = CLOUD_TPU[version][1]
  counted = (
      f"{version} names count TensorCores, {per_chip} per chip"
      if per_chip > 1
      else f"{version} names count chips"
  )
  return f"{name}: {n} {get(name).name} chips ({counted})"


def _shape_product(shape: str) -> int:
  """Chips of a 'AxBxC' slice shape (ConfigError for another form)."""
  dims = shape.split("x")
  if not all(d.isdigit() and int(d) > 0 for d in dims):
    raise errors.ConfigError(
        f"plan.tpu_shape {shape!r} must be chips per axis joined by 'x', "
        "e.g. 2x2x1 (v4, v5p) or 2x4 (v5e)"
    )
  return _product(int(d) for d in dims)


def planned_devices(s: settings_lib.Settings) -> int:
  """The devices planned for: the chips of a Cloud TPU slice name, else
  ``plan.devices``, else (0) the devices the mesh settings name: the
  product of its fixed axes (an axis of -1 counts as 1).

  Raises:
    errors.ConfigError: ``plan.devices`` or ``plan.tpu_shape`` contradicts
      the slice, or is out of range.
  """
  p = s.of(Plan)
  n = int(p.devices)
  if n < 0:
    raise errors.ConfigError(f"plan.devices must be >= 0, got {n}")
  for key in ("utilization", "memory_fraction"):
    v = getattr(p, key)
    low_ok = v > 0 if key == "utilization" else v >= 0
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not (low_ok and v <= 1)
    ):
      bound = "(0, 1]" if key == "utilization" else "[0, 1] (0: the platform's)"
      raise errors.ConfigError(f"plan.{key} must be in {bound}, got {v!r}")
  cloud = cloud_tpu(str(p.platform))
  if cloud is not None:
    if n and n != cloud[1]:
      raise errors.ConfigError(
          f"plan.devices {n} contradicts plan.platform {p.platform!r}, "
          f"which is {cloud[1]} chips: leave plan.devices 0"
      )
    n = cloud[1]
  if not n:
    n = _product(max(int(v), 1) for v in dataclasses.asdict(s.mesh).values())
  if p.tpu_shape:
    if not get(str(p.platform)).topology:
      raise errors.ConfigError(
          f"plan.tpu_shape {p.tpu_shape!r} is for TPU platforms; "
          f"plan.platform is {p.platform!r}: leave plan.tpu_shape ''"
      )
    chips = _shape_product(str(p.tpu_shape))
    if chips != n:
      raise errors.ConfigError(
          f"plan.tpu_shape {p.tpu_shape!r} is {chips} chips but the plan is "
          f"for {n}: make them agree (plan.devices, plan.platform or "
          "plan.tpu_shape)"
      )
  return n


def set_device_flags(s: settings_lib.Settings, environ=None) -> None:
  """Makes JAX start with the planned number of fake CPU devices.

  Sets ``XLA_FLAGS`` (any earlier host device count replaced) and
  ``JAX_PLATFORMS=cpu`` in ``environ`` (default ``os.environ``; JAX read
  that variable when it was imported, so its setting is changed too); must
  run before JAX initialises its backends. A TPU platform compiled against
  a libtpu topology needs no fake devices and keeps JAX's platforms. With
  ``plan.buffers`` the persistent compilation cache is turned off: a
  cached step would be loaded, not compiled, and dump nothing.
  """
  own = environ is None
  environ = os.environ if environ is None else environ
  n = planned_devices(s)
  flags = re.sub(
      r"--xla_force_host_platform_device_count=\S*",
      "",
      environ.get("XLA_FLAGS", ""),
  ).split()
  environ["XLA_FLAGS"] = " ".join(
      flags + [f"--xla_force_host_platform_device_count={n}"]
  )
  if not uses_topology(s):
    environ["JAX_PLATFORMS"] = "cpu"
    if own and "jax" in sys.modules:
      sys.modules["jax"].config.update("jax_platforms", "cpu")
  if s.of(Plan).buffers:  # Compiled anew, to dump (``plan_buffers``).
    environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    if own and "jax" in sys.modules:
      sys.modules["jax"].config.update("jax_enable_compilation_cache", False)


def uses_topology(s: settings_lib.Settings) -> bool:
  """Whether the plan compiles against a libtpu topology (a TPU platform,
  ``plan.tpu_topology`` not switched off, and libtpu installed)."""
  platform = get(s.of(Plan).platform)
  if not platform.topology or not s.of(Plan).tpu_topology:
    return False
  import importlib.util  # pylint: disable=g-import-not-at-top

  return importlib.util.find_spec("libtpu") is not None


def topology_name(platform: Platform, devices: int, shape: str = "") -> str:
  """The libtpu topology name, e.g. 'v4:4x8x8' for 256 TPU v4 chips.

  Args:
    platform: a TPU platform.
    devices: chips.
    shape: 'AxBxC' (or 'AxB' for v5e) to use instead of the default: the
      chips as a power of two, spread over the axes as Cloud TPU's slices
      are (v4/v5p: 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...; v5e: 2x2, 2x4,
      4x4, ...).

  Raises:
    errors.ConfigError: a count that is not a power of two >= 4 and no shape.
  """
  if shape:
    return f"{platform.topology}:{shape}"
  if devices < 4 or devices & (devices - 1):
    raise errors.ConfigError(
        f"plan.devices {devices} is no standard {platform.name} slice (a "
        "power of two >= 4): set --config.plan.tpu_shape=AxBxC"
    )
  dims = [2, 2] if platform.topology == "v5e" else [2, 2, 1]
  while _product(dims) < devices:
    i = max(j for j, d in enumerate(dims) if d == min(dims))
    dims[i] *= 2
  return f"{platform.topology}:{'x'.join(map(str, dims))}"


def _product(xs) -> int:
  out = 1
  for x in xs:
    out *= x
  return out
