"""Checks of a config and its mesh, run before anything is written.

Part of the experiment layer (``memjax.experiment`` re-exports these).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from memjax import errors
from memjax.run import optim
from memjax.run import profiling
from memjax import registry
from memjax.tasks import base as task_lib
from memjax import sharding as sharding_lib

# Compute dtypes by config name (``model.dtype``).
DTYPES = ("float32", "bfloat16")


# Positive integers every run needs.
_POSITIVE = (
    "data.seq_len",
    "data.batch_size",
    "data.segments_per_lane",
    "train.num_steps",
    "train.grad_accum",
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "eval.window_len",
    "eval.score_len",
    "eval.batch_size",
    "model.num_layers",
    "model.d_model",
    "model.num_heads",
    "model.head_dim",
    "model.d_ff",
)
_NON_NEGATIVE = (
    "train.eval_every",
    "train.eval_max_windows",
    "eval.max_windows",
    "model.mem_len",
    "optim.warmup_steps",
)


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks the values every run relies on before anything is written.

  Raises:
    errors.ConfigError: naming the key and the accepted values.
  """
  for key in _POSITIVE:
    v = _get(config, key)
    if not isinstance(v, int) or v < 1:
      raise errors.ConfigError(f"{key} must be a positive integer, got {v!r}")
  for key in _NON_NEGATIVE:
    v = _get(config, key)
    if not isinstance(v, int) or v < 0:
      raise errors.ConfigError(f"{key} must be an integer >= 0, got {v!r}")
  if config.eval.score_len > config.eval.window_len:
    raise errors.ConfigError(
        f"eval.score_len {config.eval.score_len} must be <= eval.window_len "
        f"{config.eval.window_len}"
    )
  if config.data.batch_size % config.train.grad_accum:
    raise errors.ConfigError(
        f"data.batch_size {config.data.batch_size} is not divisible by "
        f"train.grad_accum {config.train.grad_accum}"
    )
  if config.model.dtype not in DTYPES:
    raise errors.ConfigError(
        f"model.dtype must be one of {list(DTYPES)}, got {config.model.dtype!r}"
    )
  # ConfigError naming the registered names for an unknown method.
  registry.MODEL_FAMILIES.get(config.model.family)
  registry.ATTENTION.get(config.model.attention)
  _check_feed_forward(config.model)
  registry.OBJECTIVES.get(config.loss.name)
  registry.BATCHERS.get(config.data.batching)
  task_lib.get(config).check_config(config)  # e.g. an unknown corpus.
  optim.group_settings(config.optim)  # ConfigError for a malformed group.
  profiling.profile_steps(config)
  run_config_checks(config)


def run_config_checks(config: ml_collections.ConfigDict) -> None:
  """Runs every check in ``registry.CONFIG_CHECKS`` (ConfigError on failure)."""
  for name in registry.CONFIG_CHECKS.names():
    registry.CONFIG_CHECKS.get(name)(config)


def _check_feed_forward(mcfg: ml_collections.ConfigDict) -> None:
  """The feed-forward kind exists, its layers are in range, and the kind's
  own ``check_config(model_config)`` (when it has one) passes."""
  cls = registry.FEED_FORWARD.get(mcfg.feed_forward)
  for n in mcfg.get("feed_forward_layers", ()):
    if not isinstance(n, int) or not 1 <= n <= mcfg.num_layers:
      raise errors.ConfigError(
          f"model.feed_forward_layers has {n!r}: layer numbers count from 1 "
          f"to model.num_layers {mcfg.num_layers}"
      )
  check = getattr(cls, "check_config", None)
  if check is not None:
    check(mcfg)


def make_mesh(
    config: ml_collections.ConfigDict, spec: Optional[Mapping[str, int]] = None
) -> Mesh:
  """The device mesh of ``config.mesh``, or of ``spec``: an explicit
  ``spec`` without -1 may use the first devices only (e.g. {'data': 1})."""
  if spec is None:
    return sharding_lib.make_mesh(config.mesh.to_dict())
  sizes = [int(spec.get(a, 1)) for a in sharding_lib.MESH_AXES]
  devices = jax.devices()
  if -1 not in sizes and 0 < int(np.prod(sizes)) < len(devices):
    devices = devices[: int(np.prod(sizes))]
  return sharding_lib.make_mesh(dict(spec), devices)
