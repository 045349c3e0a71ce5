"""``Run``: a run built once from its config, typed and frozen.

``memjax.build.build(config, workdir)`` reads the ConfigDict once and
returns a ``Run``: the typed settings, the parts they name (looked up in
the engine's and the methods' specs), the task bound to the settings, the
device mesh and where the run lives. The loop, the modes and the API take
a ``Run`` and ask it for what they need; below them everything takes the
pieces it returns (a model, a loss function, a batcher, a scorer) or the
small settings it holds, never the ConfigDict.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import optax
from jax.sharding import Mesh

from memjax import errors
from memjax import extend
from memjax import losses
from memjax import settings as settings_lib
from memjax.checkpoints import convert
from memjax.checkpoints import runfiles
from memjax.data import corpus as corpus_lib
from memjax.data import text_streams
from memjax.eval import rows
from memjax.run import hooks as hooks_lib
from memjax.run import optim


@dataclasses.dataclass(frozen=True)
class Run:
  """A run's typed parts (see the module docstring).

  Attributes:
    settings: every section of the config, typed.
    parts: the engine's and the methods' parts, by name.
    task: the run's task (``settings.task``), a ``memjax.tasks.base.Task``
      bound to the settings.
    mesh: the device mesh.
    workdir: where the run reads and writes.
    config_json: the config as the run saves it (``config.json``).
  """

  settings: settings_lib.Settings
  parts: extend.Parts
  task: Any
  mesh: Mesh
  workdir: str
  config_json: str = dataclasses.field(default="{}", repr=False)

  # -- what the settings name ------------------------------------------------

  @property
  def family(self) -> extend.Family:
    """The model family (``model.family``)."""
    return self.parts.families.get(self.settings.model.family)

  @property
  def feed_forward(self) -> extend.FeedForward:
    """The feed-forward kind (``model.feed_forward``)."""
    return self.parts.feed_forward.get(self.settings.model.feed_forward)

  @property
  def kind(self) -> str:
    """'<task>/<model.family>', what a mode checks it takes."""
    return f"{self.settings.task}/{self.settings.model.family}"

  @property
  def extra_inputs(self) -> tuple[str, ...]:
    """The batch arrays the model takes besides inputs and targets."""
    return tuple(self.family.extra_inputs)

  def carries_memory(self) -> bool:
    """Whether the model carries a recurrent memory across steps (its
    attention kind with ``model.mem_len`` > 0)."""
    m = self.settings.model
    return self.parts.attention.get(m.attention).carries_memory(m.mem_len)

  def state_collections(self) -> tuple[str, ...]:
    """The mutable collections the model keeps across steps: its family's
    and its feed-forward kinds' (the model's and the plain one)."""
    names = list(self.family.state_collections)
    names += self.feed_forward.state_collections
    names += self.parts.feed_forward.get("ffn").state_collections
    return tuple(dict.fromkeys(names))

  # -- parts ------------------------------------------------------------------

  def model(self, vocab_size: int) -> Any:
    """The model (a Flax module) with a vocabulary of ``vocab_size``."""
    return self.family.build(
        self.settings.model, vocab_size=int(vocab_size), parts=self.parts
    )

  def signature(self, vocab_size: int) -> dict[str, Any]:
    """What a checkpoint or export of this model must match."""
    runs = getattr(self.model(vocab_size), "layer_runs", list)()
    return convert.signature(
        self.settings.name,
        dataclasses.asdict(self.settings.model),
        vocab_size,
        settings_lib.Model.RUNTIME_KEYS,
        self.feed_forward.runtime_options,
        scanned=[r.name for r in runs if r.scanned],
    )

  def objective(self, num_steps: Optional[int] = None) -> losses.LossFn:
    """The loss function of ``loss.name`` over ``num_steps`` updates
    (default ``train.num_steps``)."""
    steps = self.settings.train.num_steps if num_steps is None else num_steps
    make = self.parts.objectives.get(self.settings.loss.name)
    return make(self.settings, int(steps))

  def optimizer(
      self, num_steps: Optional[int] = None
  ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimiser, learning-rate schedule) over ``num_steps`` updates
    (default ``train.num_steps``)."""
    steps = self.settings.train.num_steps if num_steps is None else num_steps
    return optim.make_optimizer(
        self.settings.optim,
        int(steps),
        self.parts.optimizer_transforms,
        self.settings.model.param_dtype,
    )

  def batcher(self, train: Any, cache_dir: str) -> Any:
    """The training batcher of ``data.batching`` over the training data."""
    batcher = self.parts.batchers.get(self.settings.data.batching)
    return batcher.make(self.settings, train, cache_dir)

  def batch_shapes(self, devices: int) -> dict[str, Any]:
    """{name: (shape, dtype name)} of a training batch on ``devices``
    devices, known without data.

    Raises:
      errors.ConfigError: the batcher cannot say (``Batcher.shapes``).
    """
    name = self.settings.data.batching
    batcher = self.parts.batchers.get(name)
    if batcher.shapes is None:
      raise errors.ConfigError(
          f"data.batching={name!r} declares no batch shapes: it cannot be "
          "planned without its data"
      )
    return batcher.shapes(self.settings, devices)

  def host_batch(self, batcher: Any, step: int) -> dict[str, Any]:
    """The global batch of ``step`` with only the arrays a step consumes."""
    return corpus_lib.host_batch(batcher, step, self.extra_inputs)

  def scoring(
      self,
      model: Any,
      mesh: Optional[Mesh] = None,
      unit: str = "ppl",
      path: str = "",
      step: int = 0,
  ) -> rows.Scoring:
    """What a scorer needs to score ``model`` (``memjax.eval.scorer_for``).

    Args:
      model: the model.
      mesh: its mesh (default the run's).
      unit: 'ppl' or 'bpc'.
      path: the run or export the parameters come from (its ``tune.json``
        and datastore).
      step: the training step of the parameters.
    """
    s = self.settings
    source = path or self.workdir
    bos = text_streams.window_bos(text_streams.tokenizer_dir(s.data, source))
    return rows.Scoring(
        model=model,
        mesh=self.mesh if mesh is None else mesh,
        unit=unit,
        eval=s.eval,
        memory=s.eval_memory,
        sections=s.sections,
        memories=self.parts.eval_memories,
        extra_inputs=self.extra_inputs,
        segment_len=s.eval.segment_len or s.data.seq_len,
        mem_len=s.eval.mem_len or s.model.mem_len,
        path=path or self.workdir,
        sum_reports=tuple(r for _, r in self.parts.sum_reports.items()),
        signature=self.signature(model.cfg.vocab_size),
        step=int(step),
        datastore_corpus=s.of(settings_lib.Datastore).corpus,
        window_bos=bos,
    )

  def hooks(self, states: Any = None, **context: Any) -> hooks_lib.HookRunner:
    """The step hooks of ``train.hooks`` with their saved ``states``."""
    return hooks_lib.HookRunner(
        self.settings,
        self.parts.hooks,
        states,
        workdir=self.workdir,
        **context,
    )

  # -- where it restores from -----------------------------------------------

  def source(self) -> str:
    """What a mode restores: the workdir when it holds a run or an export,
    else the run of ``train.init_from``.

    Raises:
      errors.MissingRunError: neither holds one.
    """
    try:
      runfiles.find(self.workdir)
      return self.workdir
    except errors.MissingRunError:
      if not self.settings.train.init_from:
        raise
      return self.settings.train.init_from

  def replace(self, *sections: Any, **changes: Any) -> "Run":
    """A copy with settings sections replaced (``run.replace(
    dataclasses.replace(run.settings.eval, batch_size=8))``) and fields
    changed (``workdir=...``)."""
    new = self.settings.replace(*sections) if sections else self.settings
    if new is not self.settings and "task" not in changes:
      changes["task"] = self.parts.tasks.get(new.task)(new)
    return dataclasses.replace(self, settings=new, **changes)
