"""A model's variables besides its parameters: the state a run carries
and the statistics modules sow.

**Model state** is the mutable collections a run carries besides the
parameters.

A layer that keeps state across training steps (a BatchNorm's running
mean and variance in Flax's ``'batch_stats'``) is a feed-forward kind that
declares the collection (``extend.FeedForward.state_collections``); so may
a model family (``extend.Family.state_collections``); the run gathers them
(``memjax.run.spec.Run.state_collections``). The train state carries those
collections (``memjax.run.step.TrainState.model_state``):
every training step applies the model with them mutable and keeps what it
wrote; evaluation reads them (``deterministic=True``: BatchNorm uses its
running averages) and never writes them.

Whatever runs the model for inference takes either a parameter tree or a
whole variables dict ({'params': ..., <collection>: ...}); ``as_variables``
turns both into what ``model.apply`` takes.

**Statistics** are what modules report from inside a forward pass.

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

Per-slot sums (a memory layer's reads of each slot, say) are too large for
'aux': a method sows them into a collection of its own and declares a
``SumReport`` (``extend.Method.sum_reports``) saying how to turn one
module's sums into metrics; the tasks' evaluations collect every report's
collection and add what each report says to their results.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from memjax.models import layer_layout

Array = jax.Array
COLLECTION = "aux"


def split(
    variables: Mapping[str, Any], collections: Sequence[str]
) -> tuple[Any, Optional[dict[str, Any]]]:
  """(params, model state) of ``model.init``'s variables; the state holds
  the ``collections`` the model declares that it made, None when it made
  none (e.g. a memory layer with a LayerNorm query)."""
  state = {c: variables[c] for c in collections if c in variables}
  return variables["params"], (state or None)


def as_variables(
    params: Any, model_state: Optional[Mapping[str, Any]] = None
) -> dict[str, Any]:
  """What ``model.apply`` takes, from a parameter tree (and its state), or
  from a variables dict (a mapping with a 'params' entry) as it is.

  A parameter tree's top-level keys name modules, and no module of ours is
  named 'params'.
  """
  if isinstance(params, Mapping) and "params" in params:
    return dict(params)
  return {"params": params, **(model_state or {})}


def params_of(variables: Any) -> Any:
  """The parameter tree of a parameter tree or a variables dict."""
  if isinstance(variables, Mapping) and "params" in variables:
    return variables["params"]
  return variables


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
  """{'path/to/name': [..., 2]} of a (possibly empty) 'aux' collection,
  one path per layer where layers were scanned."""
  if not collection:
    return {}
  flat = flax.traverse_util.flatten_dict(
      layer_layout.unstack_layers(flax.core.unfreeze(collection)), sep="/"
  )
  return dict(flat)


def apply(model: nn.Module, variables: Any, *args, **kwargs) -> tuple[Any, Any]:
  """``model.apply`` with the 'aux' collection collected.

  Returns:
    (the model's output, {path: [2] float32 (weighted sum, weight)}).
  """
  out, sums, _ = apply_with_state(model, variables, (), *args, **kwargs)
  return out, sums


def apply_with_state(
    model: nn.Module,
    variables: Any,
    state_collections: Sequence[str],
    *args,
    **kwargs,
) -> tuple[Any, Any, dict[str, Any]]:
  """``apply`` that also lets the model write ``state_collections``
  (e.g. a BatchNorm's 'batch_stats' while training).

  Returns:
    (the model's output, the 'aux' sums as ``apply``'s, {collection: the
    tree the model left} of ``state_collections``).
  """
  mutable = [COLLECTION, *state_collections]
  out, state = model.apply(variables, *args, mutable=mutable, **kwargs)
  new = {c: state[c] for c in state_collections if c in state}
  return out, flatten(state.get(COLLECTION, {})), new


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


@dataclasses.dataclass(frozen=True)
class SumReport:
  """Per-slot sums that modules sow during evaluation, and what they mean.

  Attributes:
    collection: the Flax collection the modules sow into ({module path:
      {name: [slots] sums}}).
    key: where the per-module metrics go in a split's results ('memory').
    metrics: one module's sums {name: [slots]} -> {metric: float}.
    scalars: the metrics logged to TensorBoard.
    brief: one module's metrics -> a few words for the progress line.
    describe: one module's metrics -> the summary line's words.
    compare: the sums of two groups of examples (e.g. two classes) ->
      {module: {metric: float}}; None when the report has no comparison.
    describe_comparison: one module's comparison -> words.
  """

  collection: str
  key: str
  metrics: Callable[[Mapping[str, np.ndarray]], dict[str, float]]
  scalars: tuple[str, ...] = ()
  brief: Callable[[Mapping[str, float]], str] = lambda m: ""
  describe: Callable[[Mapping[str, float]], str] = lambda m: ""
  compare: Optional[Callable[[Any, Any], dict[str, dict[str, float]]]] = None
  describe_comparison: Callable[[Mapping[str, float]], str] = lambda d: ""

  def by_module(self, sums: Any) -> dict[str, dict[str, float]]:
    """{module path: metrics} of the summed collection (a nested dict of
    [slots] arrays; {} when nothing was sown)."""
    return {k: self.metrics(v) for k, v in sorted(module_sums(sums).items())}


def module_sums(sums: Any) -> dict[str, dict[str, np.ndarray]]:
  """{'layer_1/ffn/memory': {'reads': [K], ...}} of a nested collection
  (one entry per layer where layers were scanned)."""
  flat = (
      flax.traverse_util.flatten_dict(
          layer_layout.unstack_layers(dict(sums)), sep="/"
      )
      if sums
      else {}
  )
  out: dict[str, dict[str, np.ndarray]] = {}
  for k, v in flat.items():
    module, name = k.rsplit("/", 1)
    out.setdefault(module, {})[name] = np.asarray(v)
  return out
