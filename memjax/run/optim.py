"""Optimisers, learning-rate schedules and parameter groups (optax).

``make_optimizer(settings.optim, num_steps, transforms)`` builds the base
optimiser (``optim.optimizer`` with its schedule) and, when ``optim.groups``
names parameter groups, gives the parameters each group's regex matches the
group's own optimiser and schedule. A transform the engine or a method
declares (``extend.Method.optimizer_transforms``) can replace the optimiser
of the base or a group.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.run import step as step_lib

Optim = settings_lib.Optim


def make_schedule(o: Optim, num_steps: int) -> optax.Schedule:
  """Learning-rate schedule with linear warm-up.

  * ``cosine``: warm-up then cosine decay to ``min_lr_ratio * lr`` at
    ``num_steps`` (fairseq's cosine with a single period);
  * ``inverse_sqrt``: warm-up then ``lr * sqrt(warmup / step)``;
  * ``constant``: warm-up then constant;
  * ``linear``: warm-up then linear decay to ``min_lr_ratio * lr`` at
    ``num_steps`` (BERT's schedule).
  """
  lr = float(o.learning_rate)
  warm = int(o.warmup_steps)
  if o.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warm else lr,
        peak_value=lr,
        warmup_steps=warm,
        decay_steps=max(num_steps, warm + 1),
        end_value=lr * float(o.min_lr_ratio),
    )
  if o.schedule == "inverse_sqrt":

    def sched(step):
      import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

      step = jnp.maximum(step, 1).astype(jnp.float32)
      if warm == 0:
        return lr / jnp.sqrt(step)
      return jnp.where(
          step < warm, lr * step / warm, lr * jnp.sqrt(warm / step)
      )

    return sched
  if o.schedule == "linear":
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0 if warm else lr, lr, max(warm, 1)),
            optax.linear_schedule(
                lr, lr * float(o.min_lr_ratio), max(num_steps - warm, 1)
            ),
        ],
        [warm],
    )
  if o.schedule == "constant":
    if warm:
      return optax.linear_schedule(0.0, lr, warm)
    return optax.constant_schedule(lr)
  raise errors.ConfigError(
      f"unknown optim.schedule {o.schedule!r}; use cosine, inverse_sqrt, "
      "constant or linear"
  )


# ----------------------------------------------------------------------------
# Custom transformations and parameter groups
# ----------------------------------------------------------------------------

# A declared transformation (``extend.Method.optimizer_transforms``):
# factory(optim settings, schedule) -> optax.GradientTransformation.
# ``optim.transform = name`` (or a group's ``transform``) replaces the standard
# optimiser of ``optim.optimizer`` with ``factory(settings, schedule)``:
# ``settings`` are the ``optim`` keys with the group's overrides, ``schedule``
# the group's learning-rate schedule. Inside a group the transformation sees
# only the group's parameters and gradients (``optax.multi_transform``), e.g.
# an embedding table whose update should touch only the rows a batch looked
# up (lazy Adam). Clipping by ``optim.clip_norm`` still comes first, over all
# gradients.
TransformFactory = Callable[
    [Optim, optax.Schedule], optax.GradientTransformation
]
Transforms = extend.Lookup[TransformFactory]

# Keys of ``optim`` a parameter group may override (besides ``params``).
GROUP_KEYS = (
    "optimizer",
    "learning_rate",
    "schedule",
    "warmup_steps",
    "min_lr_ratio",
    "weight_decay",
    "b1",
    "b2",
    "eps",
    "momentum",
    "transform",
)
# The label of the parameters that match no group.
BASE_GROUP = "base"


def frozen(o: Optim, sched: optax.Schedule) -> optax.GradientTransformation:
  """Leaves a group's parameters exactly as they are (zero updates), e.g.
  the memory of a fine-tuned model held fixed (Kim & Jung's Table 5)."""
  del o, sched
  return optax.set_to_zero()


def _standard_optimizer(
    o: Optim, sched: optax.Schedule, where: str, transforms: Transforms
) -> optax.GradientTransformation:
  """The optimiser of ``o.optimizer`` or the declared ``o.transform``."""
  if o.transform:
    if o.transform not in transforms:
      raise errors.ConfigError(
          f"unknown {where}.transform {o.transform!r}; there are: "
          f"{', '.join(transforms.names())}"
      )
    return transforms.get(o.transform)(o, sched)
  name = o.optimizer
  if name == "adam":
    return optax.adamw(
        sched, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay
    )
  if name == "nag":
    # fairseq's NAG with momentum 0.99, as in Baevski & Auli.
    return optax.chain(
        optax.add_decayed_weights(o.weight_decay)
        if o.weight_decay
        else optax.identity(),
        optax.sgd(sched, momentum=o.momentum, nesterov=True),
    )
  if name == "sgd":
    return optax.sgd(sched, momentum=o.momentum or None)
  raise errors.ConfigError(
      f"unknown {where}.optimizer {name!r}; use adam, nag or sgd"
  )


def group_settings(o: Optim) -> dict[str, tuple[re.Pattern, Optim]]:
  """The parameter groups of ``o.groups``: {name: (regex, settings)}.

  ``settings`` are the base ``optim`` keys with the group's overrides.

  Raises:
    errors.ConfigError: a group that is not a ConfigDict, has no ``params``
      regex or an invalid one, overrides an unknown key, or is named 'base'.
  """
  out = {}
  for name, group in (o.groups or {}).items():
    where = f"optim.groups.{name}"
    if name == BASE_GROUP:
      raise errors.ConfigError(f"{where}: the group name 'base' is reserved")
    if not isinstance(group, Mapping):
      raise errors.ConfigError(
          f"{where} must be a ConfigDict of settings, got {group!r}"
      )
    group = dict(group)
    unknown = sorted(set(group) - set(GROUP_KEYS) - {"params"})
    if unknown:
      raise errors.ConfigError(
          f"{where}: unknown keys {unknown}; a group has 'params' (a regex "
          f"over parameter paths) and overrides of {list(GROUP_KEYS)}"
      )
    pattern = group.pop("params", "")
    if not isinstance(pattern, str) or not pattern:
      raise errors.ConfigError(
          f"{where}.params must be a regex over parameter paths such as "
          "'layer_0/attention/query/kernel'"
      )
    try:
      regex = re.compile(pattern)
    except re.error as e:
      raise errors.ConfigError(
          f"{where}.params {pattern!r} is not a regex: {e}"
      ) from None
    out[name] = (regex, dataclasses.replace(o, groups={}, **group))
  return out


def path_name(path: tuple[Any, ...]) -> str:
  """'layer_0/attention/query/kernel' of a pytree key path (the ``value``
  attribute of boxed parameters is left out)."""
  parts = []
  for key in path:
    if isinstance(key, jax.tree_util.DictKey):
      parts.append(str(key.key))
    elif isinstance(key, jax.tree_util.SequenceKey):
      parts.append(str(key.idx))
  return "/".join(parts)


def param_labels(params: Any, groups: Mapping[str, re.Pattern]) -> Any:
  """The group of every parameter: a pytree of labels shaped like ``params``.

  A parameter belongs to the group whose regex matches its path
  (``re.search`` on 'layer_0/attention/query/kernel'), or to 'base' when
  none does.

  Raises:
    errors.ConfigError: a parameter matched by two groups, or a group that
      matches no parameter.
  """
  used = set()

  def label(path, _):
    name = path_name(path)
    hits = [g for g, regex in groups.items() if regex.search(name)]
    if len(hits) > 1:
      raise errors.ConfigError(
          f"parameter {name} matches optim.groups {hits}; make their params "
          "regexes disjoint"
      )
    used.update(hits)
    return hits[0] if hits else BASE_GROUP

  labels = jax.tree_util.tree_map_with_path(label, params)
  unused = [g for g in groups if g not in used]
  if unused:
    first = path_name(jax.tree_util.tree_flatten_with_path(params)[0][0][0])
    raise errors.ConfigError(
        f"optim.groups.{unused[0]}.params {groups[unused[0]].pattern!r} "
        f"matches no parameter (parameters are named like {first!r})"
    )
  return labels


def layout(o: Optim) -> dict[str, Any]:
  """What shapes the optimiser state: the optimiser or transform of the base
  and of every group, and the groups' regexes (saved with checkpoints)."""

  def kind(group: Optim) -> dict[str, str]:
    return {"optimizer": group.optimizer, "transform": group.transform}

  out = kind(o)
  groups = group_settings(o)
  if groups:
    out["groups"] = {
        name: {"params": regex.pattern, **kind(group)}
        for name, (regex, group) in groups.items()
    }
  return out


def float32_state(
    tx: optax.GradientTransformation,
) -> optax.GradientTransformation:
  """``tx`` keeping its state, and computing its updates, in float32 for
  parameters of a narrower dtype (``model.param_dtype='bfloat16'``).

  Gradients and parameters are upcast before ``tx`` sees them, so Adam's
  moments are float32 as MaxText keeps them for ``weight_dtype=bfloat16``;
  ``optax.apply_updates`` then rounds each parameter's float32 sum back to
  its own dtype. optax's ``mu_dtype`` covers the first moment only, hence
  this wrapper.
  """

  up = lambda tree: step_lib.as_param_dtype(tree, jnp.float32)  # noqa: E731

  def init(params: Any) -> Any:
    return tx.init(up(params))

  def update(updates: Any, state: Any, params: Any = None) -> Any:
    return tx.update(up(updates), state, None if params is None else up(params))

  return optax.GradientTransformation(init, update)


def make_optimizer(
    o: Optim,
    num_steps: int,
    transforms: Transforms,
    param_dtype: str = "float32",
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Builds the optimiser of the ``optim`` settings ``o``, with the
  declared ``transforms`` by name.

  Parameters matching a group of ``o.groups`` are updated by the group's
  optimiser and schedule (``optax.multi_transform``), the others by the base
  one; see ``group_settings`` and ``param_labels``.

  Returns:
    (transformation, the base schedule). Gradient clipping by global norm
    (over all parameters) comes first when ``clip_norm > 0``; with
    ``param_dtype`` other than float32 the whole chain keeps float32 state
    (``float32_state``).
  """
  sched = make_schedule(o, num_steps)
  opt = _standard_optimizer(o, sched, "optim", transforms)
  groups = group_settings(o)
  if groups:
    by_group = {BASE_GROUP: opt}
    for name, (_, c) in groups.items():
      by_group[name] = _standard_optimizer(
          c, make_schedule(c, num_steps), f"optim.groups.{name}", transforms
      )
    patterns = {name: regex for name, (regex, _) in groups.items()}
    opt = optax.multi_transform(
        by_group, lambda params: param_labels(params, patterns)
    )
  parts: list[Any] = []
  if o.clip_norm and o.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(o.clip_norm))
  parts.append(opt)
  tx = optax.chain(*parts)
  if param_dtype != "float32":
    tx = float32_state(tx)
  return tx, sched
