"""Optimisers and learning-rate schedules (optax)."""

from __future__ import annotations

from typing import Any

import ml_collections
import optax

from memjax import errors


def make_schedule(
    cfg: ml_collections.ConfigDict, num_steps: int
) -> optax.Schedule:
  """Learning-rate schedule with linear warm-up.

  * ``cosine``: warm-up then cosine decay to ``min_lr_ratio * lr`` at
    ``num_steps`` (fairseq's cosine with a single period);
  * ``inverse_sqrt``: warm-up then ``lr * sqrt(warmup / step)``;
  * ``constant``: warm-up then constant.
  """
  lr = float(cfg.learning_rate)
  warm = int(cfg.warmup_steps)
  if cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warm else lr,
        peak_value=lr,
        warmup_steps=warm,
        decay_steps=max(num_steps, warm + 1),
        end_value=lr * float(cfg.min_lr_ratio),
    )
  if cfg.schedule == "inverse_sqrt":

    def sched(step):
      import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

      step = jnp.maximum(step, 1).astype(jnp.float32)
      if warm == 0:
        return lr / jnp.sqrt(step)
      return jnp.where(
          step < warm, lr * step / warm, lr * jnp.sqrt(warm / step)
      )

    return sched
  if cfg.schedule == "constant":
    if warm:
      return optax.linear_schedule(0.0, lr, warm)
    return optax.constant_schedule(lr)
  raise errors.ConfigError(
      f"unknown optim.schedule {cfg.schedule!r}; use cosine, inverse_sqrt or "
      "constant"
  )


def make_optimizer(
    cfg: ml_collections.ConfigDict, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Builds the optimiser from ``config.optim``.

  Returns:
    (transformation, schedule). Gradient clipping by global norm comes first
    when ``clip_norm > 0``.
  """
  sched = make_schedule(cfg, num_steps)
  name = cfg.optimizer
  if name == "adam":
    opt = optax.adamw(
        sched, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
  elif name == "nag":
    # fairseq's NAG with momentum 0.99, as in Baevski & Auli.
    opt = optax.chain(
        optax.add_decayed_weights(cfg.weight_decay)
        if cfg.weight_decay
        else optax.identity(),
        optax.sgd(sched, momentum=cfg.momentum, nesterov=True),
    )
  elif name == "sgd":
    opt = optax.sgd(sched, momentum=cfg.momentum or None)
  else:
    raise errors.ConfigError(
        f"unknown optim.optimizer {name!r}; use adam, nag or sgd"
    )
  parts: list[Any] = []
  if cfg.clip_norm and cfg.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.clip_norm))
  parts.append(opt)
  return optax.chain(*parts), sched
