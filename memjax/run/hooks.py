"""Step hooks: registered code the training loop runs every N updates.

A hook is a ``StepHook`` subclass registered under a name in
``memjax.registry.HOOKS``::

    @registry.HOOKS.register("reindex")
    class Reindex(hooks.StepHook):

      def start(self):  # Before the first update, new run or resumed.
        if "index" in self.state:
          self.ctx.batcher.use_index(self.state["index"])

      def __call__(self, step, params):
        path = build_index(params, self.ctx.workdir, step)
        self.ctx.batcher.use_index(path)
        self.state["index"] = path

and switched on in the config: ``config.train.hooks = ("reindex",)``,
``config.train.hook_options.reindex = ConfigDict({"every": 1000})``. The
loop calls each hook, in the order of ``train.hooks``, after every update
whose step (1-based) is a multiple of its ``every`` and before that step's
checkpoint, with the current variables (sharded ``jax.Array``s: the
parameter tree, or a variables dict when the model carries state).

A hook may write files into ``ctx.workdir`` (only from process 0,
``ctx.is_chief``, on several hosts) and change what the batcher reads. Its
``state`` is a JSON-serialisable dict saved with every checkpoint (in the
checkpoint's ``data`` item, written atomically with it) and handed back on
resume, so a resumed run continues from the hook state of the checkpoint it
resumes, not from calls made after that checkpoint. Files a hook wrote after
the last checkpoint are not rolled back: name them by step, or rewrite them
atomically. Batches are a pure function of the step and of what the batcher
reads, so a hook that changes the data must record in its state what it
changed and re-apply it in ``start``.

A method's hooks are found through its package (``REGISTERS['HOOKS']``);
hooks registered outside ``memjax`` are found once their module is imported
(a config file can import it).
"""

from __future__ import annotations

import abc
import dataclasses
import json
from typing import Any, Mapping, Optional

import jax
import ml_collections

from memjax import errors
from memjax import registry


@dataclasses.dataclass
class HookContext:
  """What a hook can reach.

  Attributes:
    name: the hook's registered name.
    options: its ``train.hook_options.<name>`` (``every`` included).
    config: the run's config.
    workdir: the run's directory.
    is_chief: whether this process writes files (process 0).
    model: the ``TransformerLM``.
    mesh: the device mesh.
    corpus: the corpus (``experiment.Corpus``).
    batcher: the training batcher, whose data a hook may change.
    writer: the metric writer (TensorBoard), or None.
  """

  name: str
  options: ml_collections.ConfigDict
  config: ml_collections.ConfigDict
  workdir: str
  is_chief: bool = True
  model: Any = None
  mesh: Any = None
  corpus: Any = None
  batcher: Any = None
  writer: Any = None


class StepHook(abc.ABC):
  """A step hook. Subclass it, implement ``__call__`` and register it."""

  def __init__(self, ctx: HookContext, state: dict[str, Any]) -> None:
    """Creates the hook.

    Args:
      ctx: what the hook can reach.
      state: {} for a new run; on resume, the state saved with the
        checkpoint the run resumes from.
    """
    self.ctx = ctx
    self.state = state

  def start(self) -> None:
    """Runs once before the first update of this process (new or resumed
    run): re-apply here what ``self.state`` records."""

  @abc.abstractmethod
  def __call__(self, step: int, params: Any) -> None:
    """Runs after update ``step`` (1-based) with the current variables:
    the parameter tree, or {'params': ..., <collection>: ...} when the
    model carries state (``models.state.params_of`` gives the tree)."""


def _options(config: ml_collections.ConfigDict, name: str) -> Any:
  return (config.train.get("hook_options") or {}).get(name)


def every_of(config: ml_collections.ConfigDict, name: str) -> int:
  """Steps between calls of hook ``name`` (``hook_options.<name>.every``,
  default 1)."""
  options = _options(config, name)
  return 1 if options is None else options.get("every", 1)


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises errors.ConfigError for an unknown hook name, a name listed
  twice, or an ``every`` that is not a positive integer."""
  names = tuple(config.train.get("hooks") or ())
  for name in names:
    if name not in registry.HOOKS:
      raise errors.ConfigError(
          f"unknown step hook {name!r} in train.hooks; registered: "
          f"{', '.join(registry.HOOKS.names()) or 'none'} "
          "(memjax.registry.HOOKS; import the module that registers it, "
          "e.g. from the config file)"
      )
    options = _options(config, name)
    if options is not None and not isinstance(
        options, (ml_collections.ConfigDict, dict)
    ):
      raise errors.ConfigError(
          f"train.hook_options.{name} must be a ConfigDict, got {options!r}"
      )
    every = every_of(config, name)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
      raise errors.ConfigError(
          f"train.hook_options.{name}.every must be a positive integer, "
          f"got {every!r}"
      )
  if len(set(names)) != len(names):
    raise errors.ConfigError(f"train.hooks lists a hook twice: {names}")


class HookRunner:
  """The configured hooks of a run, their schedule and their state."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      states: Optional[Mapping[str, Any]] = None,
      **context: Any,
  ) -> None:
    """Creates the hooks of ``config.train.hooks``.

    Args:
      config: the run's config (checked with ``check_config``).
      states: {name: state} saved with the checkpoint resumed from.
      **context: the other ``HookContext`` fields (workdir, model, ...).
    """
    check_config(config)
    states = dict(states or {})
    self.hooks: list[tuple[StepHook, int]] = []
    for name in tuple(config.train.get("hooks") or ()):
      options = _options(config, name)
      ctx = HookContext(
          name=name,
          options=ml_collections.ConfigDict(dict(options or {})),
          config=config,
          is_chief=jax.process_index() == 0,
          **context,
      )
      state = json.loads(json.dumps(states.get(name, {})))
      self.hooks.append(
          (registry.HOOKS.get(name)(ctx, state), every_of(config, name))
      )

  def start(self) -> None:
    for hook, _ in self.hooks:
      hook.start()

  def run(self, step: int, params: Any) -> None:
    """Calls the hooks due after update ``step`` (1-based)."""
    for hook, every in self.hooks:
      if step % every == 0:
        hook(step, params)

  def states(self) -> dict[str, Any]:
    """{name: state}, a JSON copy to save with a checkpoint.

    Raises:
      TypeError: a hook's state is not JSON-serialisable.
    """
    out = {}
    for hook, _ in self.hooks:
      try:
        out[hook.ctx.name] = json.loads(json.dumps(hook.state))
      except (TypeError, ValueError) as e:
        raise TypeError(
            f"step hook {hook.ctx.name!r}: its state is not JSON ({e})"
        ) from e
    return out
