"""Auxiliary statistics that modules report from inside a forward pass.

A module reports a statistic with ``report_mean(module, name, values,
weights)``: it sows a [2] float32 array (weighted sum, total weight) into the
flax collection ``'aux'``, and repeated reports of one name in one module add
up. Nothing is recorded unless the caller makes the collection mutable, so a
plain ``model.apply`` pays nothing.

``apply(model, variables, ...)`` runs a model with the collection mutable and
returns its output and the sums flattened by module path
(``{'layer_0/attention/alpha': [2]}``). Sums add over micro-batches, scanned
segments, steps and (because the sums inside a jitted function are global)
devices; ``means`` divides them on the host. The train step adds them up
over its micro-batches and lane segments, the loop logs their means as
``train/aux/<path>`` (TensorBoard) and under ``"aux"`` in
``train_log.jsonl``, and evaluation reports them beside the perplexity
(``<split>/aux/<path>``). The large per-position arrays kept for analysis
(``--mode=analyze``) stay in the ``'intermediates'`` collection.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
COLLECTION = "aux"


def _zeros() -> Array:
  return jnp.zeros((2,), jnp.float32)


def _add(a: Array, b: Array) -> Array:
  return a + b


def report_mean(
    module: nn.Module,
    name: str,
    values: Array,
    weights: Optional[Array] = None,
) -> None:
  """Reports the weighted mean of ``values`` as the statistic ``name``.

  Args:
    module: the reporting module (inside its ``__call__`` or a method).
    name: the statistic's name within the module.
    values: [...] the values to average.
    weights: [...] their weights (broadcast against ``values``), e.g. 0 for
      invalid slots; None = all ones.
  """
  values = values.astype(jnp.float32)
  if weights is None:
    weights = jnp.ones_like(values)
  weights = jnp.broadcast_to(weights.astype(jnp.float32), values.shape)
  pair = jnp.stack([jnp.sum(values * weights), jnp.sum(weights)])
  module.sow(COLLECTION, name, pair, init_fn=_zeros, reduce_fn=_add)


def flatten(collection: Mapping[str, Any]) -> dict[str, Array]:
  """{'path/to/name': [..., 2]} of a (possibly empty) 'aux' collection."""
  if not collection:
    return {}
  flat = flax.traverse_util.flatten_dict(
      flax.core.unfreeze(collection), sep="/"
  )
  return dict(flat)


def apply(model: nn.Module, variables: Any, *args, **kwargs) -> tuple[Any, Any]:
  """``model.apply`` with the 'aux' collection collected.

  Returns:
    (the model's output, {path: [2] float32 (weighted sum, weight)}).
  """
  out, state = model.apply(variables, *args, mutable=[COLLECTION], **kwargs)
  return out, flatten(state.get(COLLECTION, {}))


def total(sums: Mapping[str, Array]) -> dict[str, Array]:
  """Adds stacked sums ([..., 2], e.g. from ``lax.scan``) into [2] each."""
  return {k: jnp.sum(v.reshape((-1, 2)), axis=0) for k, v in sums.items()}


def means(sums: Mapping[str, Any]) -> dict[str, float]:
  """Host-side means {path: sum / weight} of [..., 2] sums; a statistic
  with no weight (nothing counted yet) is left out."""
  out = {}
  for k, v in sums.items():
    s, w = np.asarray(v, np.float64).reshape((-1, 2)).sum(axis=0)
    if w > 0:
      out[k] = float(s / w)
  return out
