"""The TRIME training objective (Eq. 5) with its three training memories.

Declared as the objective 'trime' (``loss.name``) with the check
``check_trime_settings`` (``memjax/methods/trime/__init__.py``); its
settings are ``config.Trime``. The loss maths are in
``memjax/methods/trime/in_batch.py``; the visibility rules of the memories in
``memjax/memory/visibility.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from memjax import errors
from memjax import losses
from memjax import settings as settings_lib
from memjax.memory import visibility
from memjax.methods.trime import config
from memjax.methods.trime import in_batch as trime
from memjax.models import transformer

LossFn = losses.LossFn
LMOutput = transformer.LMOutput

Array = jax.Array


TRIME_MEMORIES = ("local", "long", "external")


# Folded into the run's seed for the per-step draw that hides the local memory
# (TRIMELM_ext), so it never shares a key with dropout.
_HIDE_LOCAL_STREAM = 0x7E1A


def long_memory_spec(lane_id: Array) -> trime.MemorySpec:
  """The long-term memory of a batch of lanes of consecutive segments.

  Rows of one lane (``lane_id`` [B]) are consecutive segments of one stream in
  row order (``streams.ConsecutiveSegments`` and ``streams.RandomBlocks``
  yield them lane-major), so the row index orders them: a token sees every
  earlier token of its lane in the batch (and on any shard).

  Args:
    lane_id: [B] int, the lane (document) of each row.

  Returns:
    A 'long' MemorySpec with doc_id = lane_id and segment_index = row index.
  """
  rows = lane_id.shape[0]
  return trime.MemorySpec.long(lane_id, jnp.arange(rows, dtype=jnp.int32))


def hide_local_draw(seed: int, step: Array, p: float) -> Array:
  """Scalar bool: hide the local memory at ``step`` (TRIMELM_ext).

  Drawn once per update from (seed, step) only, so every micro-batch and
  every host of a step agrees, and a resumed run draws the same values.
  """
  key = jax.random.fold_in(jax.random.PRNGKey(seed), _HIDE_LOCAL_STREAM)
  return visibility.draw_hide_local(jax.random.fold_in(key, step), p)


def check_trime_settings(s: settings_lib.Settings) -> None:
  """Raises ConfigError for TRIME's loss settings out of range, or where
  the loss's memory cannot work with the batches (before anything is
  written: a method check of ``build.check``).

  'long' needs lanes of m > 1 consecutive segments, and every micro-batch
  must hold whole lanes (each micro-batch is its own in-batch memory).
  """
  if s.loss.name != "trime":
    return
  loss = s.of(config.Trime)
  if loss.memory not in TRIME_MEMORIES:
    raise errors.ConfigError(
        f"unknown trime.memory {loss.memory!r}; use one of {TRIME_MEMORIES}"
    )
  for key in ("local_hide_prob", "lm_warmup_fraction"):
    value = float(getattr(loss, key))
    if not 0.0 <= value <= 1.0:
      raise errors.ConfigError(f"trime.{key} must be in [0, 1], got {value}")
  d = s.data
  if loss.memory != "long":
    return
  m = int(d.segments_per_lane)
  if d.batching not in ("blocks", "consecutive") or m < 2:
    raise errors.ConfigError(
        "trime.memory='long' needs lanes of consecutive segments: set "
        "data.batching='blocks' (or 'consecutive') and data.segments_per_lane > 1"
    )
  micro = d.batch_size // max(int(s.train.grad_accum), 1)
  if micro % m:
    raise errors.ConfigError(
        f"trime.memory='long': the micro-batch of {micro} rows (data.batch_size / "
        f"train.grad_accum) is not a multiple of data.segments_per_lane {m}, so "
        "lanes would be split between micro-batches"
    )


def _training_memory(
    memory: str, batch: dict[str, Array], seed: int, step: Array, p: float
) -> tuple[trime.MemorySpec, Array]:
  """The TRIME training memory of a step and whether the local memory is
  hidden (a bool scalar; only ever true for 'external')."""
  hide = jnp.asarray(False)
  if memory == "long":
    if "lane_id" not in batch:
      raise errors.ConfigError(
          "trime.memory='long' needs batches of lanes ('lane_id'): use "
          "data.batching='blocks' or 'consecutive' with data.segments_per_lane > 1"
      )
    return long_memory_spec(batch["lane_id"]), hide
  if memory == "external":
    hide = hide_local_draw(seed, step, p)
    return trime.MemorySpec.external(hide), hide
  return trime.MemorySpec.local(), hide


def make_trime_loss(s: settings_lib.Settings, num_steps: int) -> LossFn:
  """The TRIME objective (Eq. 5) with the training memory of
  ``trime.memory`` (``cfg`` below: the ``config.Trime`` settings).

  * 'local': earlier tokens of the same segment (TRIMELM);
  * 'long': earlier tokens of the same lane in the batch, across its
    consecutive segments (TRIMELM_long; needs ``lane_id`` in the batch);
  * 'external': every token of the other segments of the batch, plus the
    local memory unless it is hidden for the whole step with probability
    ``cfg.local_hide_prob`` (TRIMELM_ext, with BM25-packed batches).

  The first ``round(cfg.lm_warmup_fraction * num_steps)`` updates use the
  plain LM loss (``lax.cond`` on the step, so the memory sums are not
  computed then). ``cfg.stop_gradient_memory`` stops the gradient into the
  memory keys; ``cfg.block_size`` (0 = dense) sets the blockwise tiles.

  Args:
    s: the run's settings (the seed: the external mode's per-step draw).
    num_steps: total updates of the run (for the warm-up).

  Returns:
    A LossFn.

  Raises:
    ValueError: for an unknown memory or a hide probability outside [0, 1].
  """
  cfg, seed = s.of(config.Trime), s.seed
  memory, p, warmup_steps = _settings(cfg, num_steps)
  block_size = int(cfg.block_size) or None
  stop_memory = bool(cfg.stop_gradient_memory)

  def with_memory(spec, operands):
    loss, aux = trime.trime_loss(
        *operands,
        spec=spec,
        block_size=block_size,
        stop_gradient_memory=stop_memory,
    )
    return loss, (
        aux["lm_loss"],
        aux["memory_target_share"],
        aux["frac_with_positive"],
        jnp.float32(1.0),
    )

  def loss_fn(
      output: LMOutput, batch: dict[str, Array], *, step: Array, rng: Array
  ) -> tuple[Array, dict[str, Array]]:
    del rng
    w = losses.batch_weights(batch)
    tokens = jnp.sum(w)
    spec, hide = _training_memory(memory, batch, seed, step, p)
    args = (
        output.features,
        output.target_logprob,
        output.log_z,
        batch["targets"],
        w,
    )
    if warmup_steps > 0:
      loss, terms = jax.lax.cond(
          step >= warmup_steps,
          functools.partial(with_memory, spec),
          _plain_loss,
          args,
      )
    else:
      loss, terms = with_memory(spec, args)
    return loss, _metrics(loss, terms, hide, tokens)

  return loss_fn


def _settings(loss: config.Trime, num_steps: int) -> tuple[str, float, int]:
  """(training memory, local hide probability, warm-up updates) of
  ``config.trime`` (checked by ``check_trime_settings``)."""
  frac = float(loss.lm_warmup_fraction)
  return (
      loss.memory,
      float(loss.local_hide_prob),
      int(round(frac * num_steps)),
  )


def _plain_loss(operands: tuple[Array, ...]) -> tuple[Array, tuple]:
  """The plain LM loss of the warm-up, with the memory terms at zero."""
  tlp, weights = operands[1], operands[4]
  loss = -jnp.sum(tlp * weights) / jnp.maximum(jnp.sum(weights), 1.0)
  zero = jnp.float32(0.0)
  return loss, (loss, zero, zero, zero)


def _metrics(
    loss: Array, terms: tuple[Array, ...], hide: Array, tokens: Array
) -> dict[str, Array]:
  """The step's metrics: sums over the batch, and token-weighted sums of the
  memory terms (the loop logs them divided by 'tokens')."""
  lm, share, positive, active = terms
  stop = jax.lax.stop_gradient
  return {
      "nll_sum": loss * tokens,
      "tokens": tokens,
      "aux_lm_loss_sum": stop(lm * tokens),
      "aux_memory_share_sum": stop(share * tokens),
      "aux_with_positive_sum": stop(positive * tokens),
      "aux_memory_on_sum": stop(active * tokens),
      "aux_hide_local_sum": stop(active * hide.astype(jnp.float32) * tokens),
  }
