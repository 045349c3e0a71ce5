"""Training objectives as pure functions of the model's outputs.

Every objective has the signature
``loss_fn(output: LMOutput, batch: dict, *, step, rng) -> (loss, metrics)``
where ``loss`` is the mean negative log-likelihood per weighted target and
``metrics`` holds float32 scalars summed over the batch (``nll_sum``,
``tokens``) so that micro-batches and hosts can be added up.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections

from memjax.models.transformer import LMOutput

Array = jax.Array
LossFn = Callable[..., tuple[Array, dict[str, Array]]]


def batch_weights(batch: dict[str, Array]) -> Array:
  """[B, T] float32 weights: batch['weights'] if present, else ones."""
  if "weights" in batch:
    return batch["weights"].astype(jnp.float32)
  return jnp.ones(batch["targets"].shape, jnp.float32)


def lm_loss(output: LMOutput, batch: dict[str, Array], *, step: Array,
            rng: Array) -> tuple[Array, dict[str, Array]]:
  """The plain language-modelling objective: mean NLL of the targets."""
  del step, rng
  w = batch_weights(batch)
  nll_sum = -jnp.sum(output.target_logprob * w)
  tokens = jnp.sum(w)
  loss = nll_sum / jnp.maximum(tokens, 1.0)
  return loss, {"nll_sum": nll_sum, "tokens": tokens}


def make_loss(cfg: ml_collections.ConfigDict, num_steps: int) -> LossFn:
  """Builds the objective named by ``config.loss.name``."""
  del num_steps
  if cfg.name == "lm":
    return lm_loss
  raise ValueError(f"unknown loss.name {cfg.name!r}; use one of: lm")


