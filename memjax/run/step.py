"""The jitted train step: forward, loss, gradients (accumulated), update.

``make_train_step`` builds ``(state, batch, rng) -> (state, metrics)`` for
any model and any loss of ``memjax.losses``; ``run_lane_segments`` runs the
consecutive segments of each lane in order, carrying recurrent memory.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from memjax import losses
from memjax import sharding as sharding_lib
from memjax.models import variables as model_vars
from memjax.models import transformer
from memjax.models import stack
from memjax.run import state as state_lib

Array = jax.Array
TrainState = state_lib.TrainState


# ----------------------------------------------------------------------------
# Step
# ----------------------------------------------------------------------------


def _split_micro(x: Array, n: int) -> Array:
  return x.reshape((n, x.shape[0] // n) + x.shape[1:])


def run_lane_segments(
    model,
    params: Any,
    batch: dict[str, Array],
    memory: Any,
    segments_per_lane: int,
    *,
    rng: Array,
    deterministic: bool = False,
) -> transformer.LMOutput:
  """Runs the m consecutive segments of every lane in order, carrying memory.

  A consecutive batch holds ``lanes * m`` rows, lane-major (lane 0's m
  segments, then lane 1's, ...). Segment k of every lane is run with the
  memory left by segment k - 1 (``jax.lax.scan`` over the m segments), and
  the outputs are stacked back into the batch's row order, so a loss sees
  each lane's whole stream with gradients into every segment's outputs.

  Args:
    model: a ``TransformerLM`` that carries memory.
    params: its parameters.
    batch: 'inputs', 'targets' [lanes * m, L] int32.
    memory: the memory of the lanes ([lanes, ...] leaves).
    segments_per_lane: m.
    rng: dropout key; segment k uses ``fold_in(rng, k)``.
    deterministic: disables dropout.

  Returns:
    ``LMOutput`` with [lanes * m, L(, D)] arrays in the batch's row order
    and the memory after each lane's last segment.
  """
  return run_lane_segments_with_stats(
      model,
      params,
      batch,
      memory,
      segments_per_lane,
      rng=rng,
      deterministic=deterministic,
  )[0]


def run_lane_segments_with_stats(
    model,
    params: Any,
    batch: dict[str, Array],
    memory: Any,
    segments_per_lane: int,
    *,
    rng: Array,
    deterministic: bool = False,
    model_state: Any = None,
) -> tuple[transformer.LMOutput, dict[str, Array], Any]:
  """``run_lane_segments`` that also returns the auxiliary statistics the
  modules report (``memjax.models.variables``), summed over the m segments:
  {path: [2] float32 (weighted sum, weight)}, and the model state (see
  ``make_train_step``) after the m segments, updated in their order."""
  m = segments_per_lane
  names = tuple(model_state or ())

  def to_segments(x):  # [lanes * m, ...] -> [m, lanes, ...]
    return jnp.swapaxes(x.reshape((-1, m) + x.shape[1:]), 0, 1)

  def to_rows(x):  # [m, lanes, ...] -> [lanes * m, ...]
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape((-1,) + x.shape[2:])

  def body(carry, xs):
    mem, ms = carry
    inputs, targets, k = xs
    out, sums, new_ms = model_vars.apply_with_state(
        model,
        model_vars.as_variables(params, ms),
        () if deterministic else names,
        inputs,
        targets,
        memory=mem,
        deterministic=deterministic,
        rngs={"dropout": jax.random.fold_in(rng, k)},
    )
    return (out.memory, new_ms or ms), (out.replace(memory=None), sums)

  (new_memory, new_state), (outs, sums) = jax.lax.scan(
      body,
      (memory, model_state),
      (
          to_segments(batch["inputs"]),
          to_segments(batch["targets"]),
          jnp.arange(m),
      ),
      unroll=stack.unroll_factor(m),
  )
  outs = jax.tree.map(to_rows, outs).replace(memory=new_memory)
  return outs, model_vars.total(sums), new_state


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
      return run_lane_segments_with_stats(
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
  (``run_lane_segments``); micro-batches then hold whole lanes.

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
