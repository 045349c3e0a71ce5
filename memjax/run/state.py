"""The train state: what a step updates, built on the mesh without allocating.

``TrainState`` (step, parameters, optimiser state, carried recurrent memory,
model state), ``abstract_state`` / ``create_state`` (its shapes and
shardings from the model's logical axes; initialised directly on the mesh),
``abstract_params`` / ``abstract_variables`` (what a restore fills in).
``collections`` is the run's state collections
(``memjax.run.spec.Run.state_collections``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from memjax.checkpoints import checkpointing
from memjax import sharding as sharding_lib
from memjax.models import variables as model_vars

Array = jax.Array


class WithVariables:
  """``variables`` of a class with ``params`` and ``model_state``: the
  parameters, or with the model state a variables dict (``variables_of``):
  what every scoring path takes."""

  @property
  def variables(self) -> Any:
    return variables_of(self.params, self.model_state)


@flax.struct.dataclass
class TrainState(WithVariables):
  """Everything a step updates.

  Attributes:
    step: scalar int32 update counter.
    params: model parameters.
    opt_state: optimiser state (None when restored for inference).
    memory: carried recurrent memory (per-layer pytrees with a leading batch
      axis) or None for models without recurrence.
    model_state: {collection: tree} of the mutable collections the model
      declares and made (``memjax.models.variables``, e.g. a BatchNorm's
      'batch_stats'), replicated; None when there are none (every
      checkpoint written before the field existed).
  """

  step: Array
  params: Any
  opt_state: Any
  memory: Any = None
  model_state: Any = None


def variables_of(params: Any, model_state: Any) -> Any:
  """``params`` alone, or {'params': params, **model_state} when the model
  carries state: what every scoring path takes as its parameters."""
  if not model_state:
    return params
  return model_vars.as_variables(params, model_state)


def as_param_dtype(params: Any, dtype: Any) -> Any:
  """``params`` (arrays, boxed or ``jax.ShapeDtypeStruct`` leaves) with their
  floating leaves in ``dtype``; integer leaves are kept."""

  def cast(x):
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == dtype:
      return x
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
    return x.astype(dtype)

  return jax.tree.map(cast, params)


def _init_variables(
    model, collections: Sequence[str], seq_len: int, key: Array
) -> tuple[Any, Any]:
  """(params in ``model.param_dtype``, model state or None) of a fresh
  model. The modules make float32 parameters (their initialisers sample
  in float32); they are rounded once here, so every module computes with
  weights of either dtype (``model.dtype`` sets the compute dtype)."""
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  variables = model.init(
      {"params": key, "dropout": key}, tokens, tokens, deterministic=True
  )
  params, state = model_vars.split(variables, collections)
  return as_param_dtype(params, model.cfg.weight_dtype), state


def abstract_state(
    model,
    tx: Optional[optax.GradientTransformation],
    mesh: Mesh,
    sample: dict[str, Any],
    collections: Sequence[str] = (),
) -> tuple[Callable[[Array], TrainState], TrainState, Any]:
  """The train state's shapes and shardings, without allocating it.

  Args:
    model: the model.
    tx: the optimiser, or None for parameters only (``opt_state`` None).
    mesh: device mesh.
    sample: a batch, arrays or ``jax.ShapeDtypeStruct`` ('inputs' [B, L];
      'reset' [lanes] for lane batches).
    collections: the model's state collections.

  Returns:
    (init_fn, abstract, shardings): ``init_fn(key)`` builds the boxed
    state, ``abstract`` its unboxed ``jax.ShapeDtypeStruct`` tree, and the
    shardings follow the model's logical axis names through
    ``sharding.LOGICAL_RULES``.
  """
  seq_len = sample["inputs"].shape[1]
  # The carried memory has one row per lane ('reset' is [lanes]).
  batch = sample["reset" if "reset" in sample else "inputs"].shape[0]

  def init_fn(key):
    params, model_state = _init_variables(model, collections, seq_len, key)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=None if tx is None else tx.init(params),
        memory=model.init_memory(batch),
        model_state=model_state,
    )

  with nn.logical_axis_rules(sharding_lib.LOGICAL_RULES):
    abstract = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
    logical = nn.get_partition_spec(abstract)
    shardings = sharding_lib.divisible(
        sharding_lib.logical_sharding(mesh, logical), nn.meta.unbox(abstract)
    )
  if abstract.memory is not None:
    mem_shard = jax.tree.map(
        lambda x: sharding_lib.batch_sharding(mesh, x.ndim),
        nn.meta.unbox(abstract.memory),
    )
    shardings = shardings.replace(memory=mem_shard)
  if abstract.model_state is not None:
    # Running statistics are small: every device holds them whole.
    shardings = shardings.replace(
        model_state=jax.tree.map(
            lambda _: sharding_lib.replicated(mesh),
            nn.meta.unbox(abstract.model_state),
        )
    )
  # A boxed parameter whose optimiser state is empty in a parameter group
  # (optax's MaskedNode inside the box) got a sharding leaf: give the
  # shardings the state's own structure, which checkpoint restores pair
  # leaf by leaf.
  shardings = jax.tree.broadcast(
      shardings,
      nn.meta.unbox(abstract),
      is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
  )
  return init_fn, nn.meta.unbox(abstract), shardings


def create_state(
    model,
    tx: Optional[optax.GradientTransformation],
    mesh: Mesh,
    sample: dict[str, np.ndarray],
    rng: Array,
    collections: Sequence[str] = (),
) -> tuple[TrainState, Any]:
  """(state, state_shardings): the train state initialised from ``rng``
  directly on the mesh (the other arguments as ``abstract_state``'s)."""
  init_fn, _, shardings = abstract_state(model, tx, mesh, sample, collections)
  with sharding_lib.mesh_rules(mesh):
    state = jax.jit(
        lambda k: nn.meta.unbox(init_fn(k)), out_shardings=shardings
    )(rng)
  return state, shardings


def abstract_params(model, mesh: Mesh, seq_len: int = 8) -> Any:
  """The parameters' shapes and shardings, as ``jax.ShapeDtypeStruct``."""
  return abstract_variables(model, mesh, (), seq_len)[0]


def abstract_variables(
    model, mesh: Mesh, collections: Sequence[str] = (), seq_len: int = 8
) -> tuple[Any, Any]:
  """(parameters, model state or None) as ``jax.ShapeDtypeStruct`` with
  shardings; the model state (of ``collections``) replicated."""
  key = jax.random.PRNGKey(0)
  with nn.logical_axis_rules(sharding_lib.LOGICAL_RULES):
    params, state = jax.eval_shape(
        lambda k: _init_variables(model, collections, seq_len, k), key
    )
    shardings = sharding_lib.divisible(
        sharding_lib.logical_sharding(mesh, nn.get_partition_spec(params)),
        nn.meta.unbox(params),
    )
  params = checkpointing.abstract_with_sharding(
      nn.meta.unbox(params), shardings
  )
  if state is not None:
    state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=sharding_lib.replicated(mesh)
        ),
        nn.meta.unbox(state),
    )
  return params, state
