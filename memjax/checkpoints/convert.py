"""Layouts written before: what a run saved, read as today's code lays it out.

A checkpoint or an export records its model's signature (``signature``)
with a ``signature_version``. When a later version changes what the
signature holds or where a parameter lives, the conversion from each
earlier version is written here, and every restore applies it:
``Layout.of(saved signature)`` says how the saved arrays are named, and
``to_saved`` / ``to_current`` map a tree of arrays (parameters, optimiser
state, model state, or their abstract shapes) between that layout and
today's. The restores in ``memjax.checkpoints`` and ``memjax.run.restore``
build their targets with ``to_saved`` and hand back ``to_current``'s
trees, so nothing above them sees an old layout.

Versions:

* 1: the signature held a few model keys (compared on those alone).
* 2: the whole model config, less the keys added later while they held
  the value every earlier model had (``LATER_MODEL_KEYS``), less the
  feed-forward options added later at theirs; the translation and encoder
  families named their blocks' sub-layers ``self_attention``/``ln_self``
  and ``ln_attention`` and their residual dropout ``drop``.
* 3 (today): the whole model section less its runtime keys, and every
  family's blocks name their sub-layers as the decoder LM's do
  (``attention``, ``ln_attn``, ..., ``Dropout_0``). The options of the
  attention and feed-forward kinds (one dataclass per kind) are held
  where they differ from the kind's defaults only; a signature that holds
  some at their defaults (written before every option was filled in)
  reads as one without them (``without_defaults``), with no new version.

Scanned layers (``model.scan_layers``, ``memjax.models.stack``) are a
layout of today's, not a version: a signature lists the stacked blocks it
was saved with (``scanned``: ``layer_0_to_2``, ...; none when absent), the
restoring model's come from its own tree (``Layout.into``), and the
arrays are unstacked into one entry per layer, then stacked into the other
side's blocks. So a run trained scanned resumes unscanned and the other way
round, and an export or ``train.init_from`` reads either.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Mapping, Sequence

from memjax.models import layer_layout

VERSION = 3

# Model keys added to the signature after version 2, with the value every
# model saved before them had: a version-2 signature without them had it.
LATER_MODEL_KEYS = {
    "family": "decoder_lm",
    "family_options": {},
    "feed_forward": "ffn",
    "feed_forward_options": {},
    "norm_position": "pre",
    "norm_epsilon": 1e-6,
    "final_layer_norm": True,
    "adaptive_dropout": 0.0,
    "feed_forward_layers": [],
    "activation": "relu",
}
# Feed-forward options that change no weight, once in signatures: left
# out of today's (``extend.FeedForward.runtime_options``).
_RUNTIME_OPTIONS = ("allow_batchnorm_future_leak",)

# Version 2's sub-layer names of the families that named them otherwise:
# {family: {old name: today's}}, for the keys right under a block.
_BLOCK_RENAMES = {
    "encoder_decoder": {"self_attention": "attention", "ln_self": "ln_attn"},
    "encoder": {"ln_attention": "ln_attn"},
}
_BLOCK = re.compile(r"^(layer|encoder|decoder)_\d+$")


def signature(
    name: str,
    model: Mapping[str, Any],
    vocab_size: int,
    runtime_keys: tuple[str, ...] = (),
    runtime_options: tuple[str, ...] = (),
    scanned: Sequence[str] = (),
) -> dict[str, Any]:
  """Today's signature: what a checkpoint or export must match.

  Args:
    name: the run's name.
    model: the model section as plain values (``dataclasses.asdict``).
    vocab_size: V.
    runtime_keys: model keys that change how, not what, it computes.
    runtime_options: the feed-forward kind's options of that sort.
    scanned: the model's stacked blocks (not compared: a layout; left
      out when there are none).
  """
  m = json.loads(json.dumps(dict(model)))
  sig = {k: v for k, v in m.items() if k not in runtime_keys}
  sig["feed_forward_options"] = {
      k: v
      for k, v in (sig.get("feed_forward_options") or {}).items()
      if k not in runtime_options
  }
  sig["vocab_size"] = int(vocab_size)
  sig = without_defaults(sig)
  out = {"model": sig, "name": name, "signature_version": VERSION}
  if scanned:
    out["scanned"] = list(scanned)
  return out


# The model's kinds and their options' keys.
_OPTIONS = (
    ("attention", "attention_options"),
    ("feed_forward", "feed_forward_options"),
)
# ``kind_defaults(kind key, name) -> {option: default} | None``, the
# declared kinds' (``memjax.config.kind_defaults``, which hands it over when
# imported: the kinds are the catalog's, above this module).
_KIND_DEFAULTS: list[Callable[[str, str], Any]] = []


def use_kind_defaults(kind_defaults: Callable[[str, str], Any]) -> None:
  """Sets where ``without_defaults`` finds the kinds' option defaults."""
  _KIND_DEFAULTS[:] = [kind_defaults]


def kind_defaults(slot: str, name: str) -> Any:
  """{option: default} of the kind ``name`` of ``slot`` ('attention' or
  'feed_forward'), or None (no such kind, or none handed over)."""
  return _KIND_DEFAULTS[0](slot, name) if _KIND_DEFAULTS else None


def without_defaults(model: Mapping[str, Any]) -> dict[str, Any]:
  """A signature's model with the options its kinds hold at their
  defaults left out: an option a later version declares, or a config
  fills in, leaves the signature as it was. A kind of no known name keeps
  its options."""
  out = dict(model)
  for slot, key in _OPTIONS:
    defaults = kind_defaults(slot, str(out[slot])) if slot in out else None
    if defaults and isinstance(out.get(key), Mapping):
      plain = json.loads(json.dumps(defaults))
      out[key] = {
          k: v for k, v in out[key].items() if k not in plain or v != plain[k]
      }
  return out


def upgrade(saved: Mapping[str, Any]) -> dict[str, Any]:
  """A saved signature as today's would read it (version 1 is returned as
  it was: it is compared on the keys it holds); the options at their
  kinds' defaults are left out (``without_defaults``), as today's leave
  them."""
  saved = json.loads(json.dumps(dict(saved)))
  version = int(saved.get("signature_version", 1))
  if version < 2:
    return saved
  if version >= VERSION:
    return dict(saved, model=without_defaults(saved.get("model", {})))
  model = dict(saved.get("model", {}))
  for k, v in LATER_MODEL_KEYS.items():
    model.setdefault(k, v)
  model["feed_forward_options"] = {
      k: v
      for k, v in model["feed_forward_options"].items()
      if k not in _RUNTIME_OPTIONS
  }
  model = without_defaults(model)
  return dict(saved, model=model, signature_version=VERSION)


def _rename_tree(tree: Any, names: Mapping[str, str], parent: str = "") -> Any:
  """``tree`` with the keys right under a block renamed by ``names``; it
  walks mappings, flax and other dataclasses, named tuples and lists (an
  optimiser state holds the parameters' tree several times)."""
  if isinstance(tree, Mapping):
    block = bool(_BLOCK.match(parent))
    return {
        (names.get(k, k) if block else k): _rename_tree(v, names, str(k))
        for k, v in tree.items()
    }
  if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
    fields = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
    new = {k: _rename_tree(v, names, parent) for k, v in fields.items()}
    return dataclasses.replace(tree, **new) if new != fields else tree
  if isinstance(tree, tuple) and hasattr(tree, "_fields"):
    return type(tree)(*(_rename_tree(v, names, parent) for v in tree))
  if isinstance(tree, (tuple, list)):
    return type(tree)(_rename_tree(v, names, parent) for v in tree)
  return tree


def _rename_path(path: str, names: Mapping[str, str]) -> str:
  parts = path.split("/")
  for i in range(1, len(parts)):
    if _BLOCK.match(parts[i - 1]):
      parts[i] = names.get(parts[i], parts[i])
  return "/".join(parts)


@dataclasses.dataclass(frozen=True)
class Layout:
  """How a saved run lays out its arrays, against the restoring model's.

  Attributes:
    renames: {old sub-layer name: today's} under each block ({} = today's
      names).
    saved_runs: the stacked blocks of the saved arrays.
    current_runs: the restoring model's stacked blocks.
  """

  renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
  saved_runs: tuple[str, ...] = ()
  current_runs: tuple[str, ...] = ()

  @classmethod
  def of(cls, saved: Mapping[str, Any]) -> "Layout":
    """The layout of arrays saved with the signature ``saved``, restored
    into an unscanned model (see ``into``)."""
    version = int(saved.get("signature_version", 1))
    family = dict(saved.get("model", {})).get("family", "decoder_lm")
    runs = tuple(saved.get("scanned") or ())
    if version >= VERSION or family not in _BLOCK_RENAMES:
      return cls(saved_runs=runs)
    return cls(dict(_BLOCK_RENAMES[family]), runs)

  def into(self, tree: Any) -> "Layout":
    """This layout restored into the model whose tree (or abstract tree)
    ``tree`` is: its stacked blocks are the current ones."""
    return dataclasses.replace(
        self, current_runs=layer_layout.stacked_blocks(tree)
    )

  @property
  def current(self) -> bool:
    """Whether the saved layout is the restoring model's."""
    return not self.renames and self.saved_runs == self.current_runs

  def to_current(self, tree: Any) -> Any:
    """A tree in the saved layout, in the restoring model's."""
    if self.renames:
      tree = _rename_tree(tree, self.renames)
    if self.saved_runs != self.current_runs:
      tree = layer_layout.stack_layers(tree, self.current_runs)
    return tree

  def to_saved(self, tree: Any) -> Any:
    """A tree in the restoring model's layout, in the saved one."""
    if self.saved_runs != self.current_runs:
      tree = layer_layout.stack_layers(tree, self.saved_runs)
    if not self.renames:
      return tree
    return _rename_tree(tree, {v: k for k, v in self.renames.items()})

  def path_to_current(self, path: str) -> str:
    """A saved 'a/b/c' parameter path, with today's sub-layer names."""
    return _rename_path(path, self.renames) if self.renames else path

  def shapes_to_current(self, shapes: Mapping[str, Any]) -> dict[str, Any]:
    """{saved path: shape} as {the restoring model's path: shape}."""
    out = {self.path_to_current(k): v for k, v in shapes.items()}
    if self.saved_runs != self.current_runs:
      out = layer_layout.restack_shapes(out, self.current_runs)
    return out


def placed(layout: Layout, saved: Any, like: Any) -> Any:
  """Arrays restored in ``layout``'s saved layout, in the restoring
  model's, on the shardings of ``like`` (its abstract tree) where the
  layers were stacked or unstacked on the way."""
  import jax  # pylint: disable=g-import-not-at-top

  tree = layout.to_current(saved)
  if layout.saved_runs == layout.current_runs:
    return tree
  return jax.tree.map(
      lambda x, a: jax.device_put(x, a.sharding)
      if getattr(a, "sharding", None) is not None and hasattr(x, "shape")
      else x,
      tree,
      like,
  )


CURRENT = Layout()
Converter = Callable[[Any], Any]
