"""A stack's variables laid out per layer or with its runs stacked.

``memjax.models.stack`` scans a run of identical layers as one block named
``<prefix>_<first>_to_<last>`` (``layer_0_to_2``) whose variables are
stacked on a leading ``layers`` axis; a layer alone in its run keeps its
own name (``layer_3``). The functions here move a tree of a model's
variables (parameters, an optimiser state, sown collections, or their
abstract shapes) between that layout and one entry per layer:
``unstack_layers``, ``stack_layers`` and, for {path: shape} tables,
``restack_shapes``. ``memjax.checkpoints.convert`` applies them at every
restore, so a run saved with or without ``model.scan_layers`` restores
either way.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

# '<prefix>_<first>_to_<last>': the block of a scanned run.
RUN_NAME = re.compile(r"^(.+)_(\d+)_to_(\d+)$")
# '<prefix>_<layer>': the block of one layer.
BLOCK_NAME = re.compile(r"^.+_\d+$")


def parse_name(name: str) -> Optional[tuple[str, int, int]]:
  """(prefix, first, last) of a scanned run's block name, else None."""
  match = RUN_NAME.match(name)
  if not match:
    return None
  return match.group(1), int(match.group(2)), int(match.group(3))


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
