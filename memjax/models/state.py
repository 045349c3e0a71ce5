"""Model state besides the parameters: the mutable collections a run carries.

A layer that keeps state across training steps (a BatchNorm's running
mean and variance in Flax's ``'batch_stats'``) declares the collection in
its class attribute ``STATE_COLLECTIONS``; so may a model family. The train
state carries those collections (``experiment.TrainState.model_state``):
every training step applies the model with them mutable and keeps what it
wrote; evaluation reads them (``deterministic=True``: BatchNorm uses its
running averages) and never writes them.

Whatever runs the model for inference takes either a parameter tree or a
whole variables dict ({'params': ..., <collection>: ...}); ``as_variables``
turns both into what ``model.apply`` takes.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from memjax import registry


def collections(model: Any) -> tuple[str, ...]:
  """The state collections ``model`` declares: its own
  ``STATE_COLLECTIONS`` and those of its feed-forward kinds (the model's
  ``feed_forward`` and the plain 'ffn' of its other layers)."""
  names = list(getattr(model, "STATE_COLLECTIONS", ()))
  kinds = {"ffn", getattr(model, "feed_forward", "ffn")}
  for kind in sorted(kinds):
    names += getattr(registry.FEED_FORWARD.get(kind), "STATE_COLLECTIONS", ())
  return tuple(dict.fromkeys(names))


def split(
    model: Any, variables: Mapping[str, Any]
) -> tuple[Any, Optional[dict[str, Any]]]:
  """(params, model state) of ``model.init``'s variables; the state holds
  the declared collections that the model made, None when it made none
  (e.g. a memory layer with a LayerNorm query)."""
  state = {c: variables[c] for c in collections(model) if c in variables}
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
