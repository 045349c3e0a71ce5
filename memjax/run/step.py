"""The train state and the jitted train step.

``TrainState`` (step, parameters, optimiser state, carried recurrent memory,
model state) is what a step updates; ``abstract_state`` / ``create_state``
build it on the mesh without allocating (its shapes and shardings from the
model's logical axes; initialised directly on the mesh), and
``abstract_params`` / ``abstract_variables`` give what a restore fills in.
``collections`` is the run's state collections
(``memjax.run.spec.Run.state_collections``).

``make_train_step`` builds ``(state, batch, rng) -> (state, metrics)`` for
any model and any objective (``memjax.losses``): forward, loss, gradients
(accumulated over micro-batches), update. A model that carries memory runs
the consecutive segments of each lane in order
(``memjax.models.recurrence.run_lane_segments``).
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

from memjax import losses
from memjax import sharding as sharding_lib
from memjax.checkpoints import checkpointing
from memjax.models import recurrence
from memjax.models import stack
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


# ----------------------------------------------------------------------------
# Step
# ----------------------------------------------------------------------------


def _split_micro(x: Array, n: int) -> Array:
  return x.reshape((n, x.shape[0] // n) + x.shape[1:])


def _accumulate(
    micro_grads: Callable,
    state: TrainState,
    batch: dict[str, Array],
    memory: Any,
    rng: Array,
    grad_accum: int,
) -> tuple[Any, dict[str, Array], Any]:
  """Sums ``micro_grads`` over ``grad_accum`` micro-batches with a scan.

  Args:
    micro_grads: (params, model state, micro-batch, memory, rng, step) ->
      (grads, metrics, new memory, new model state), the gradient of one
      micro-batch.
    state: the train state (params, model state and step); the model state
      passes through the micro-batches in order.
    batch: the step's batch, rows [B, ...]; 'reset' is not split.
    memory: the memory pytree with leading batch axis B, or None.
    rng: the step's key; micro-batch i uses fold_in(rng, i).
    grad_accum: n, dividing B.

  Returns:
    (summed grads, summed metrics, new memory with leading axis B or None,
    the model state after the last micro-batch).
  """
  split = lambda x: _split_micro(x, grad_accum)
  micro = jax.tree.map(split, {k: v for k, v in batch.items() if k != "reset"})
  mem_micro = None if memory is None else jax.tree.map(split, memory)

  def body(acc, xs):
    mb, mem, i = xs
    acc_g, acc_m, ms = acc
    g, m, new_mem, new_ms = micro_grads(
        state.params, ms, mb, mem, jax.random.fold_in(rng, i), state.step
    )
    return (
        jax.tree.map(jnp.add, acc_g, g),
        jax.tree.map(jnp.add, acc_m, m),
        new_ms,
    ), new_mem

  first = lambda tree: jax.tree.map(lambda x: x[0], tree)
  init_m = jax.eval_shape(
      lambda: micro_grads(
          state.params,
          state.model_state,
          first(micro),
          None if mem_micro is None else first(mem_micro),
          rng,
          state.step,
      )[1]
  )
  init_m = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), init_m)
  # Gradients add up in float32 whatever the parameters' dtype.
  zeros = jax.tree.map(
      lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)),
      state.params,
  )
  (grads, metrics, model_state), new_mem = jax.lax.scan(
      body,
      (zeros, init_m, state.model_state),
      (micro, mem_micro, jnp.arange(grad_accum)),
      unroll=stack.unroll_factor(grad_accum),
  )
  if new_mem is not None:
    new_mem = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), new_mem)
  return grads, metrics, new_mem, model_state


def _micro_grads_fn(
    model,
    loss_fn: losses.LossFn,
    segments_per_lane: int,
    extra_inputs: tuple[str, ...],
) -> Callable:
  """``(params, model_state, micro_batch, memory, rng, step) -> (grads,
  metrics, new_memory, new_model_state)``: one micro-batch's gradient of the
  loss times its weighted targets (``make_train_step``)."""
  names = lambda ms: tuple(ms or ())  # noqa: E731

  def forward(p, ms, mb, memory, rng):
    if memory is not None and segments_per_lane > 1:
      return recurrence.run_lane_segments(
          model, p, mb, memory, segments_per_lane, rng=rng, model_state=ms
      )
    out, sums, new_ms = model_vars.apply_with_state(
        model,
        model_vars.as_variables(p, ms),
        names(ms),
        mb["inputs"],
        mb["targets"],
        memory=memory,
        deterministic=False,
        rngs={"dropout": rng},
        **{k: mb[k] for k in extra_inputs},
    )
    return out, sums, (new_ms or ms)

  def micro_grads(params, ms, mb, memory, rng, step):
    def f(p):
      out, sums, new_ms = forward(p, ms, mb, memory, rng)
      loss, metrics = loss_fn(out, mb, step=step, rng=rng)
      metrics = dict(metrics, stats=sums)
      # Scale so that summing micro-batch gradients gives the batch mean.
      return loss * metrics["tokens"], (metrics, out.memory, new_ms)

    (_, (metrics, new_memory, new_ms)), grads = jax.value_and_grad(
        f, has_aux=True
    )(params)
    return grads, metrics, new_memory, new_ms

  return micro_grads


def make_train_step(
    model,
    tx,
    loss_fn: losses.LossFn,
    *,
    grad_accum: int,
    state_shardings: Any,
    mesh: Mesh,
    segments_per_lane: int = 1,
    extra_inputs: tuple[str, ...] = (),
) -> Callable:
  """Builds the jitted ``(state, batch, rng) -> (state, metrics)``.

  ``extra_inputs`` names the batch arrays the model takes as keyword
  arguments besides inputs and targets (``extend.Family.extra_inputs``,
  e.g. the encoder-decoder's 'source').

  Gradients are accumulated over ``grad_accum`` micro-batches with
  ``lax.scan``. A step whose loss or gradient norm is not finite leaves the
  state unchanged and reports ``finite = 0``, so the host can stop and name
  the step. The state argument is donated. When the state carries a memory
  and ``segments_per_lane`` m > 1, the m segments of each lane run in order
  (``memjax.models.recurrence.run_lane_segments``); micro-batches then hold
  whole lanes.

  The metrics are float32 scalars (``loss``, ``grad_norm``, ``finite``, the
  loss's sums) and ``stats``: the auxiliary statistics the modules report
  (``memjax.models.variables``), {path: [2] (weighted sum, weight)} summed over the
  micro-batches, segments and devices of the step.

  The model state (``TrainState.model_state``: the collections the model
  declares, ``memjax.models.variables``) is mutable in every forward pass and
  passes through the micro-batches (and segments) in order; a step that is
  not finite keeps the old one.
  """
  micro_grads = _micro_grads_fn(model, loss_fn, segments_per_lane, extra_inputs)

  def step_fn(state: TrainState, batch: dict[str, Array], rng: Array):
    rng = jax.random.fold_in(rng, state.step)
    memory = state.memory
    if memory is not None and "reset" in batch:
      memory = model.reset_memory(memory, batch["reset"])
    if grad_accum == 1:
      grads, metrics, new_memory, new_ms = micro_grads(
          state.params, state.model_state, batch, memory, rng, state.step
      )
    else:
      grads, metrics, new_memory, new_ms = _accumulate(
          micro_grads, state, batch, memory, rng, grad_accum
      )
    return _apply_update(tx, state, grads, metrics, new_memory, new_ms)

  return sharding_lib.jit(
      step_fn, mesh, donate_argnums=(0,), out_shardings=(state_shardings, None)
  )


def _apply_update(
    tx: Any,
    state: TrainState,
    grads: Any,
    metrics: dict[str, Array],
    new_memory: Any,
    new_model_state: Any = None,
) -> tuple[TrainState, dict[str, Array]]:
  """The state after one update from gradients summed over the step's
  weighted targets; a step whose loss or gradient norm is not finite keeps
  the parameters, optimiser state and model state (``finite`` = 0 in the
  metrics)."""
  tokens = jnp.maximum(metrics["tokens"], 1.0)
  grads = jax.tree.map(lambda g: g / tokens, grads)
  loss = metrics["nll_sum"] / tokens
  gnorm = optax.tree.norm(grads)
  updates, new_opt = tx.update(grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
  keep = lambda new, old: jax.tree.map(  # noqa: E731
      lambda a, b: jnp.where(finite, a, b), new, old
  )
  new_state = TrainState(
      step=state.step + 1,
      params=keep(new_params, state.params),
      opt_state=keep(new_opt, state.opt_state),
      memory=new_memory,
      model_state=keep(new_model_state, state.model_state),
  )
  out = dict(metrics)
  out.update(loss=loss, grad_norm=gnorm, finite=finite.astype(jnp.float32))
  return new_state, out
