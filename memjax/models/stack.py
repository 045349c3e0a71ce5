"""A stack of residual blocks, its layers scanned in runs of identical ones.

With ``model.scan_layers`` a family's consecutive layers built alike (the
same self-attention, feed-forward and cross-attention sub-layers) form a
run, and each run of two or more is one block whose parameters are
stacked on a leading ``layers`` axis and which ``nn.scan`` applies once
per layer, as MaxText's ``scan_layers`` does: the program holds one layer's
computation instead of one per layer, so it compiles in about the time of
one. The ``layers`` logical axis is not partitioned (``sharding``'s rules
map it to no mesh axis): every device holds every layer's shards of the
other axes, as without scanning.

A run's block is named ``<prefix>_<first>_to_<last>`` (``layer_0_to_2``);
a layer alone in its run keeps its own name (``layer_3``), so a stack with
product-key memories at layers 4 and 8 of 12 scans ``layer_0_to_2``,
``layer_4_to_6`` and ``layer_8_to_11`` around ``layer_3`` and ``layer_7``.
``memjax.models.layer_layout`` moves a tree of variables (parameters, an
optimiser state, sown statistics, abstract shapes) between the two
layouts; ``memjax.checkpoints.convert`` applies it at every restore.

In a compute dtype narrower than float32 a scanned block reads its
kernels already cast (``narrow_kernels``), so that the scan stacks their
gradients in that dtype, not in float32 (the same values: the layers cast
them anyway; ``docs/plan.md``, "bfloat16").

Blocks see the recurrent state of their layer (a Transformer-XL memory, a
decoder's key/value cache) as the scan's per-layer input and output, and
the hidden state as its carry; the state of the whole stack keeps its
per-layer tuple outside the scan.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax import errors

Array = jax.Array

# The logical axis of stacked layers (``sharding.LOGICAL_RULES``).
LAYERS_AXIS = "layers"
# Residuals the blocks name (``jax.ad_checkpoint.checkpoint_name``) for the
# policies below to keep: the attention probabilities before dropout
# [B, H, Q, K] (in the compute dtype where it is not float32:
# ``relative_positions.narrow_softmax``) and the feed-forward's activated
# hidden layer [B, T, d_ff].
ATTENTION_PROBS = "attention_probs"
FFN_HIDDEN = "ffn_hidden"
# What a rematerialised block keeps for the backward pass
# (``model.remat_policy``): nothing ('full': its forward pass is run
# again), every matmul's output ('dots'), or those without batch
# dimensions, i.e. not attention's ('dots_no_batch', MaxText's 'minimal'),
# the attention probabilities alone ('probs': the backward pass skips the
# scores' products and the softmax), or those and the feed-forward's
# hidden layer ('probs_ffn').
REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "probs": jax.checkpoint_policies.save_only_these_names(ATTENTION_PROBS),
    "probs_ffn": jax.checkpoint_policies.save_only_these_names(
        ATTENTION_PROBS, FFN_HIDDEN
    ),
}

# Unrolling every scan while the train step is traced: XLA's cost analysis
# counts the body of a loop once, whatever its trip count, and the step
# loops (``lax.scan``) over micro-batches, segments, scanned layers, softmax
# chunks and memory blocks. Inside ``unrolled()`` each of these scans passes
# ``unroll=length``, so the lowered program holds every iteration and XLA's
# own count is the step's. ``--mode=plan`` counts the looping program's trip
# counts instead (``memjax.modes.hlo_flops``: unrolled programs compile
# slowly and hold more temporaries); this switch builds the reference that
# count is tested against. Training never sets it.
_UNROLL = contextvars.ContextVar("memjax_unroll_scans", default=False)


@contextlib.contextmanager
def unrolled():
  """Within the block, ``unroll_factor(n)`` is ``n``: scans traced here
  unroll."""
  token = _UNROLL.set(True)
  try:
    yield
  finally:
    _UNROLL.reset(token)


def unroll_factor(length: int) -> int:
  """The ``unroll`` of a scan of ``length`` steps: all of them inside
  ``unrolled()``, else 1 (an ordinary loop)."""
  return max(int(length), 1) if _UNROLL.get() else 1


def remat_policy(name: str) -> Any:
  """The ``jax.checkpoint`` policy of ``model.remat_policy``.

  Raises:
    errors.ConfigError: an unknown name.
  """
  if name not in REMAT_POLICIES:
    raise errors.ConfigError(
        f"model.remat_policy must be one of {list(REMAT_POLICIES)}, got "
        f"{name!r}"
    )
  return REMAT_POLICIES[name]


@dataclasses.dataclass(frozen=True)
class LayerRun:
  """Consecutive layers run by one block.

  Attributes:
    prefix: the stack's block prefix ('layer', 'encoder', 'decoder').
    first: its first layer (0-based).
    count: its layers.
    scanned: one block with stacked parameters, scanned ``count`` times.
  """

  prefix: str
  first: int
  count: int
  scanned: bool

  @property
  def name(self) -> str:
    """The block's name: ``layer_3``, or ``layer_0_to_2`` when scanned."""
    if self.scanned:
      return f"{self.prefix}_{self.first}_to_{self.first + self.count - 1}"
    return f"{self.prefix}_{self.first}"


def runs(
    prefix: str,
    keys: Sequence[Any],
    scan: bool,
    breaks: Sequence[int] = (),
) -> list[LayerRun]:
  """The runs of a stack whose layer ``i`` is built as ``keys[i]`` says.

  Args:
    prefix: the blocks' prefix.
    keys: per layer, what builds it (equal keys: identical layers).
    scan: scan runs of identical layers; False: one block per layer.
    breaks: layers that start a run whatever their keys (where the family
      runs the stack in parts, as MARGE's embedder and decoder halves).
  """
  out: list[LayerRun] = []
  for i, key in enumerate(keys):
    last = out[-1] if out else None
    if (
        scan
        and last is not None
        and i not in breaks
        and keys[last.first] == key
    ):
      out[-1] = dataclasses.replace(last, count=last.count + 1)
    else:
      out.append(LayerRun(prefix, i, 1, False))
  return [dataclasses.replace(r, scanned=r.count > 1) for r in out]


def stack_trees(trees: Sequence[Any]) -> Any:
  """Per-layer pytrees (or Nones) stacked on a new leading axis."""
  if trees[0] is None:
    return None
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack_tree(tree: Any, count: int) -> list[Any]:
  """A stacked pytree (or None) as ``count`` per-layer pytrees."""
  if tree is None:
    return [None] * count
  return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(count)]


def scan(
    run: LayerRun,
    block: nn.Module,
    fn: Callable[[nn.Module, Any, Any, Any], tuple[Any, Any]],
    carry: Any,
    per_layer: Any,
    shared: Any,
) -> tuple[Any, Any]:
  """Applies ``fn`` with ``block`` once per layer of a scanned run.

  Args:
    run: the run (``run.scanned``).
    block: its block; every variable collection gets a leading layer axis
      and every random stream is split per layer.
    fn: ``fn(block, carry, layer_input, shared) -> (carry, layer_output)``.
    carry: what passes from layer to layer.
    per_layer: a pytree of [count, ...] arrays, one slice per layer.
    shared: a pytree every layer sees whole.

  Returns:
    (the last carry, the layers' outputs stacked [count, ...]).
  """
  scanned = nn.scan(
      fn,
      variable_axes={True: 0},
      split_rngs={True: True},
      in_axes=(0, nn.broadcast),
      length=run.count,
      unroll=unroll_factor(run.count),
      metadata_params={nn.PARTITION_NAME: LAYERS_AXIS},
  )
  dtype = getattr(block, "dtype", jnp.float32)
  if jnp.finfo(dtype).bits < 32 and not block.is_initializing():
    scanned = nn.map_variables(
        scanned, "params", lambda v: narrow_kernels(v, dtype)
    )
  return scanned(block, carry, per_layer, shared)


def apply(
    layers: Sequence[tuple[LayerRun, nn.Module]],
    h: Array,
    states: Optional[Sequence[Any]],
    deterministic: bool,
    *,
    layer_cross: Optional[Sequence[Mapping[str, Any]]] = None,
    **inputs: Any,
) -> tuple[Array, Array, list[Any]]:
  """Runs ``h`` through the blocks of ``layers`` in order.

  Args:
    layers: (run, block) pairs (``block_stack.BlockStack.make_stack``, or a
      slice of them).
    h: [B, T, D] the first block's input.
    states: one self-attention state per layer, or None (none).
    deterministic: disables dropout.
    layer_cross: per layer, cross-attention inputs of its own (a
      decoder's cross keys and values), merged into ``cross_inputs``.
    **inputs: the blocks' keyword inputs (``mask``, ``attend_inputs``,
      ``cross_inputs``), the same for every layer.

  Returns:
    ([B, T, D] the last block's output, its g, the layers' new states).
  """
  g, new_states = h, []
  base = layers[0][0].first if layers else 0
  for run, block in layers:
    at = slice(run.first - base, run.first - base + run.count)
    state = None if states is None else list(states[at])
    own = None if layer_cross is None else list(layer_cross[at])
    if not run.scanned:
      h, g, s = block(
          h,
          None if state is None else state[0],
          deterministic,
          **_merge_cross(inputs, None if own is None else own[0]),
      )
      new_states.append(s)
      continue

    def body(blk, carry, xs, shared):
      out, g_, s_ = blk(
          carry[0], xs[0], deterministic, **_merge_cross(shared, xs[1])
      )
      return (out, g_), s_

    (h, g), ys = scan(
        run,
        block,
        body,
        (h, h),
        (stack_trees(state or [None]), stack_trees(own or [None])),
        inputs,
    )
    new_states.extend(unstack_tree(ys, run.count))
  return h, g, new_states


def _merge_cross(
    inputs: Mapping[str, Any], own: Optional[Mapping[str, Any]]
) -> dict[str, Any]:
  """A block's keyword inputs, with a layer's own cross-attention inputs
  merged into ``cross_inputs``."""
  if own is None:
    return dict(inputs)
  return dict(
      inputs, cross_inputs={**(inputs.get("cross_inputs") or {}), **own}
  )


def narrow_kernels(params: Any, dtype: Any) -> Any:
  """``params`` with their floating ``kernel`` leaves in ``dtype``: a
  scanned block's (``scan``), whose dense layers cast them to the compute
  dtype themselves."""

  def cast(path, x):
    # The last dict key: a boxed leaf's path ends in the box's field.
    keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    name = str(keys[-1]) if keys else ""
    if name == "kernel" and jnp.issubdtype(x.dtype, jnp.floating):
      return x.astype(dtype)
    return x

  return jax.tree_util.tree_map_with_path(cast, params)
