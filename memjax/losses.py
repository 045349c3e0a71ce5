"""Training objectives as pure functions of the model's outputs.

Every objective has the signature
``loss_fn(output: LMOutput, batch: dict, *, step, rng) -> (loss, metrics)``
where ``loss`` is the mean negative log-likelihood per weighted target and
``metrics`` holds float32 scalars summed over the batch (``nll_sum``,
``tokens``) so that micro-batches and hosts can be added up. Extra metrics
start with ``aux_``; those ending in ``_sum`` are token-weighted sums that
the training loop divides by ``tokens`` before logging them.

An objective is a factory declared under the name ``loss.name`` picks (the
engine's spec, or a method's ``extend.Method.objectives``):
``make(settings, num_steps) -> loss_fn`` with the run's settings (``loss``,
the seed, a method's own section) and number of updates. Built in: 'lm'
and 'label_smoothed' (its ``loss.options.epsilon``); a method declares its
own beside its code (``memjax/methods/<method>/``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.models import variables as model_vars
from memjax.models.transformer import LMOutput

Array = jax.Array
LossFn = Callable[..., tuple[Array, dict[str, Array]]]


def batch_weights(batch: dict[str, Array]) -> Array:
  """[B, T] float32 weights: batch['weights'] if present, else ones."""
  if "weights" in batch:
    return batch["weights"].astype(jnp.float32)
  return jnp.ones(batch["targets"].shape, jnp.float32)


def lm_loss(
    output: LMOutput, batch: dict[str, Array], *, step: Array, rng: Array
) -> tuple[Array, dict[str, Array]]:
  """The plain language-modelling objective: mean NLL of the targets."""
  del step, rng
  w = batch_weights(batch)
  nll_sum = -jnp.sum(output.target_logprob * w)
  tokens = jnp.sum(w)
  loss = nll_sum / jnp.maximum(tokens, 1.0)
  return loss, {"nll_sum": nll_sum, "tokens": tokens}


def make_lm_loss(settings: settings_lib.Settings, num_steps: int) -> LossFn:
  """The plain objective (``lm_loss``); it has no settings."""
  del settings, num_steps
  return lm_loss


def make_label_smoothed_loss(
    settings: settings_lib.Settings, num_steps: int
) -> LossFn:
  """fairseq's ``label_smoothed_cross_entropy`` (``loss.options.epsilon``,
  default 0.1): with eps_i = eps / (V - 1),
  ``(1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v)``; the output must
  carry ``mean_logprob`` (the encoder-decoder's does). ``nll_sum`` holds the
  smoothed loss that is optimised; ``aux_nll_sum`` the plain NLL."""
  del num_steps
  options = dict(settings.loss.options or {})
  unknown = sorted(set(options) - {"epsilon"})
  if unknown:
    raise errors.ConfigError(
        f"loss.options has {', '.join(unknown)}, which objective "
        "'label_smoothed' does not take; its options: epsilon"
    )
  eps = float(options.get("epsilon", 0.1))
  if not 0.0 <= eps < 1.0:
    raise errors.ConfigError(f"loss.options.epsilon must be in [0, 1): {eps}")

  def loss_fn(output, batch, *, step, rng):
    del step, rng
    w = batch_weights(batch)
    nll = -output.target_logprob
    eps_i = eps / (output.vocab_size - 1)
    # sum_v(-log p_v) = V * mean_v(-log p_v).
    smooth = -output.mean_logprob * output.vocab_size
    per_token = (1.0 - eps - eps_i) * nll + eps_i * smooth
    total = jnp.sum(per_token * w)
    tokens = jnp.sum(w)
    return total / jnp.maximum(tokens, 1.0), {
        "nll_sum": total,
        "tokens": tokens,
        "aux_nll_sum": jax.lax.stop_gradient(jnp.sum(nll * w)),
    }

  return loss_fn


def summarize_aux(metrics: dict[str, Any]) -> dict[str, float]:
  """Loggable aux values: '_sum' keys divided by 'tokens', prefix dropped."""
  out = {}
  tokens = max(float(metrics.get("tokens", 1.0)), 1.0)
  for k, v in metrics.items():
    if not k.startswith("aux_"):
      continue
    if k.endswith("_sum"):
      out[k[4:-4]] = float(v) / tokens
    else:
      out[k[4:]] = float(v)
  return out


def interval_scalars(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """What the training loop logs for the steps since its last log, each a
  mean over those steps: 'train/loss', 'train/grad_norm', 'train/<aux>'
  (``summarize_aux`` of each step) and 'train/aux/<module path>/<name>'
  (the module statistics' weighted sums over the steps, ``model_vars.means``).

  Args:
    steps: the host metrics of each step: scalar 'loss' and 'grad_norm',
      the objective's 'aux_*' values with 'tokens', and optionally
      'stats' {path: [2] (weighted sum, weight)}.
  """
  out = {
      "train/loss": float(np.mean([m["loss"] for m in steps])),
      "train/grad_norm": float(np.mean([m["grad_norm"] for m in steps])),
  }
  per_step = [summarize_aux(m) for m in steps]
  for k in per_step[-1]:
    out[f"train/{k}"] = float(np.mean([a[k] for a in per_step if k in a]))
  names = steps[-1].get("stats", {})
  interval = {k: np.stack([m["stats"][k] for m in steps]) for k in names}
  for k, v in model_vars.means(interval).items():
    out[f"train/aux/{k}"] = v
  return out
