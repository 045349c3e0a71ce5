"""Model state besides the parameters: the mutable collections a run carries.

A layer that keeps state across training steps (a BatchNorm's running
mean and variance in Flax's ``'batch_stats'``) is a feed-forward kind that
declares the collection (``extend.FeedForward.state_collections``); so may
a model family (``extend.Family.state_collections``); the run gathers them
(``memjax.run.spec.Run.state_collections``). The train state carries those
collections (``memjax.run.state.TrainState.model_state``):
every training step applies the model with them mutable and keeps what it
wrote; evaluation reads them (``deterministic=True``: BatchNorm uses its
running averages) and never writes them.

Whatever runs the model for inference takes either a parameter tree or a
whole variables dict ({'params': ..., <collection>: ...}); ``as_variables``
turns both into what ``model.apply`` takes.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence


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
