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
``stack_layers`` and ``unstack_layers`` move a tree of variables
(parameters, an optimiser state, sown statistics, abstract shapes) between
the two layouts; ``memjax.checkpoints.convert`` applies them at every
restore.

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
import re
from typing import Any, Callable, Mapping, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

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
# '<prefix>_<first>_to_<last>': the block of a scanned run.
RUN_NAME = re.compile(r"^(.+)_(\d+)_to_(\d+)$")
# '<prefix>_<layer>': the block of one layer.
BLOCK_NAME = re.compile(r"^.+_\d+$")

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


def parse_name(name: str) -> Optional[tuple[str, int, int]]:
  """(prefix, first, last) of a scanned run's block name, else None."""
  match = RUN_NAME.match(name)
  if not match:
    return None
  return match.group(1), int(match.group(2)), int(match.group(3))


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


# Trees of a model's variables (parameters, optimiser states, sown
# collections, or their abstract shapes) between the layouts.


def stacked_blocks(tree: Any) -> tuple[str, ...]:
  """The names of the stacked blocks in a tree of a model's variables."""
  return tuple(sorted(_runs_in(tree)))


def unstack_layers(tree: Any) -> Any:
  """``tree`` with one entry per layer (its stacked blocks unstacked)."""
  return _restack(tree, ())


def stack_layers(tree: Any, runs: Sequence[str]) -> Any:
  """``tree`` with the layers of ``runs`` stacked under their names (its
  stacked blocks unstacked first)."""
  return _restack(tree, runs)


def _runs_in(tree: Any) -> set[str]:
  """The stacked blocks' names anywhere in ``tree`` (it walks what
  ``_restack`` walks)."""
  out = set()
  if isinstance(tree, Mapping):
    for k, v in tree.items():
      if parse_name(str(k)):
        out.add(str(k))
      else:
        out |= _runs_in(v)
  elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
    for f in dataclasses.fields(tree):
      out |= _runs_in(getattr(tree, f.name))
  elif isinstance(tree, (tuple, list)):
    for v in tree:
      out |= _runs_in(v)
  return out


def _slice(x: Any, i: int) -> Any:
  """Layer ``i`` of a stacked leaf (an array or a ShapeDtypeStruct)."""

  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(
        x.shape[1:], x.dtype, sharding=_sharding(x.sharding, drop=True)
    )
  return x[i]


def _stack(xs: Sequence[Any]) -> Any:
  """Per-layer leaves stacked on a new leading axis."""

  x = xs[0]
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(
        (len(xs),) + tuple(x.shape),
        x.dtype,
        sharding=_sharding(x.sharding, drop=False),
    )
  if isinstance(x, np.ndarray):
    return np.stack(xs)
  return jnp.stack(xs)


def _sharding(sharding: Any, drop: bool) -> Any:
  """A NamedSharding without (``drop``) or with a leading unsharded axis;
  other shardings as they are."""
  if not isinstance(sharding, jax.sharding.NamedSharding):
    return sharding
  spec = tuple(sharding.spec)
  spec = spec[1:] if drop else (None,) + spec
  return jax.sharding.NamedSharding(
      sharding.mesh, jax.sharding.PartitionSpec(*spec)
  )


def _unstack_mapping(tree: Mapping[str, Any]) -> dict[str, Any]:
  """A mapping with each stacked block's entry split into its layers."""

  out = {}
  for k, v in tree.items():
    parsed = parse_name(str(k))
    if parsed is None:
      out[k] = v
      continue
    prefix, first, last = parsed
    for i in range(last - first + 1):
      out[f"{prefix}_{first + i}"] = jax.tree.map(
          lambda x, i=i: _slice(x, i), v
      )
  return out


def _stack_mapping(
    tree: Mapping[str, Any], runs: Sequence[str]
) -> dict[str, Any]:
  """A mapping with the layers of each of ``runs`` stacked under its name.

  Leaves that only some layers have (a partial restore target) are
  stacked from the layer that has them; a run none of whose layers is
  here is left out.
  """

  out = dict(tree)
  for name in runs:
    prefix, first, last = parse_name(name)
    keys = [f"{prefix}_{i}" for i in range(first, last + 1)]
    if not any(k in out for k in keys):
      continue
    flats = [
        flax.traverse_util.flatten_dict(dict(out.pop(k, {})), sep="/")
        for k in keys
    ]
    leaves = {}
    for path in dict.fromkeys(p for f in flats for p in f):
      have = [f[path] for f in flats if path in f]
      leaves[path] = _stack([f.get(path, have[0]) for f in flats])
    out[name] = flax.traverse_util.unflatten_dict(leaves, sep="/")
  return out


def _restack(tree: Any, runs: Sequence[str]) -> Any:
  """``tree`` with every stacked block unstacked, then ``runs`` stacked;
  it walks mappings, dataclasses, named tuples and lists as
  ``_rename_tree`` does."""
  if isinstance(tree, Mapping):
    if any(_is_layer_key(k) for k in tree):
      tree = _stack_mapping(_unstack_mapping(tree), runs)
    return {k: _restack(v, runs) for k, v in tree.items()}
  if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
    fields = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
    new = {k: _restack(v, runs) for k, v in fields.items()}
    return dataclasses.replace(tree, **new)
  if isinstance(tree, tuple) and hasattr(tree, "_fields"):
    return type(tree)(*(_restack(v, runs) for v in tree))
  if isinstance(tree, (tuple, list)):
    return type(tree)(_restack(v, runs) for v in tree)
  return tree


def _is_layer_key(key: Any) -> bool:
  """A block's key: 'layer_3' or a stacked 'layer_0_to_2'."""
  return bool(BLOCK_NAME.match(str(key)) or parse_name(str(key)))


def restack_shapes(
    shapes: Mapping[str, tuple[int, ...]], runs: Sequence[str]
) -> dict[str, tuple[int, ...]]:
  """{path: shape} with stacked blocks unstacked, then ``runs`` stacked."""
  flat = {}
  for path, shape in shapes.items():
    head, _, rest = path.partition("/")
    parsed = parse_name(head)
    if parsed is None:
      flat[path] = tuple(shape)
      continue
    prefix, first, last = parsed
    for i in range(first, last + 1):
      flat[f"{prefix}_{i}/{rest}"] = tuple(shape)[1:]
  for name in runs:
    prefix, first, last = parse_name(name)
    for i in range(first, last + 1):
      for path in [p for p in flat if p.startswith(f"{prefix}_{i}/")]:
        rest = path.partition("/")[2]
        flat[f"{name}/{rest}"] = (last - first + 1,) + flat.pop(path)
  return flat
