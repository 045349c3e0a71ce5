"""Step hooks: registered code the training loop runs every N updates.

A hook is a ``StepHook`` subclass that a method declares under a name
(``extend.Method.hooks``)::

    class Reindex(hooks.StepHook):

      def start(self):  # Before the first update, new run or resumed.
        if "index" in self.state:
          self.ctx.batcher.use_index(self.state["index"])

      def __call__(self, step, params):
        path = build_index(params, self.ctx.workdir, step)
        self.ctx.batcher.use_index(path)
        self.state["index"] = path

    METHOD = extend.Method(name="mine", hooks={"reindex": Reindex})

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

A method's hooks are found through its spec; a method defined outside
``memjax`` joins with ``extend.add`` (a config file can call it).
"""

from __future__ import annotations

import abc
import dataclasses
import json
from typing import Any, Mapping, Optional

import jax

from memjax import extend
from memjax import settings as settings_lib


@dataclasses.dataclass
class HookContext:
  """What a hook can reach.

  Attributes:
    name: the hook's name.
    options: its ``train.hook_options.<name>`` (``every`` included).
    settings: the run's settings.
    workdir: the run's directory.
    is_chief: whether this process writes files (process 0).
    model: the ``TransformerLM``.
    mesh: the device mesh.
    corpus: the corpus (``memjax.data.corpus.Corpus``).
    batcher: the training batcher, whose data a hook may change.
    writer: the metric writer (TensorBoard), or None.
  """

  name: str
  options: dict[str, Any]
  settings: settings_lib.Settings
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
    model carries state (``models.variables.params_of`` gives the tree)."""


def _options(train: settings_lib.Train, name: str) -> Any:
  return (train.hook_options or {}).get(name)


def every_of(train: settings_lib.Train, name: str) -> int:
  """Steps between calls of hook ``name`` (``hook_options.<name>.every``,
  default 1)."""
  options = _options(train, name)
  return 1 if options is None else options.get("every", 1)


class HookRunner:
  """The configured hooks of a run, their schedule and their state."""

  def __init__(
      self,
      settings: settings_lib.Settings,
      hooks: extend.Lookup[type],
      states: Optional[Mapping[str, Any]] = None,
      **context: Any,
  ) -> None:
    """Creates the hooks of ``train.hooks`` (checked by ``build.check``).

    Args:
      settings: the run's settings.
      hooks: the declared hooks by name.
      states: {name: state} saved with the checkpoint resumed from.
      **context: the other ``HookContext`` fields (workdir, model, ...).
    """
    train = settings.train
    states = dict(states or {})
    self.hooks: list[tuple[StepHook, int]] = []
    for name in tuple(train.hooks or ()):
      ctx = HookContext(
          name=name,
          options=dict(_options(train, name) or {}),
          settings=settings,
          is_chief=jax.process_index() == 0,
          **context,
      )
      state = json.loads(json.dumps(states.get(name, {})))
      self.hooks.append((hooks.get(name)(ctx, state), every_of(train, name)))

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
