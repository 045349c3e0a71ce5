"""Restoring a run's arrays: a workdir or an export, onto any mesh.

``restore(run, files)`` restores the parameters (and the model state, and
on request the optimiser state) that a run or an export at ``files``
saved, for the model ``run`` describes; the run is built from the saved
config by ``memjax.dispatch.restore``. ``export`` writes a self-contained export
of restored parameters (``memjax.run.init_from`` takes the parameters two
models share, ``train.init_from``). Every restore reads arrays in today's
layout, whatever the layout they were written in
(``memjax.checkpoints.convert``).

Layout of a workdir: ``config.json``, ``vocab.json`` (+ ``vocab.txt`` for
word corpora), ``checkpoints/<step>/{state,data,meta}``. Layout of an
export: ``export.json`` (signature, step, dtype, source), ``config.json``,
``vocab.json`` (+ ``vocab.txt``), ``params/`` (Orbax), and ``model_state/``
(Orbax) for a model that carries state (``TrainState.model_state``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh

from memjax import errors
from memjax import sharding as sharding_lib
from memjax.checkpoints import checkpointing
from memjax.checkpoints import convert
from memjax.checkpoints import params as params_lib
from memjax.checkpoints import runfiles
from memjax.data import corpus as corpus_lib
from memjax.io import console
from memjax.io import paths
from memjax.models import blocks
from memjax.run import spec
from memjax.run import step as step_lib


@dataclasses.dataclass
class Restored(step_lib.WithVariables):
  """A trained model restored from a run or an export.

  Attributes:
    run: the run it belongs to (settings, parts, mesh).
    model: the model.
    params: its parameters, sharded over ``mesh``.
    step: the training step of the parameters.
    vocab: the corpus vocabulary.
    vocab_size: V.
    unit: 'ppl' or 'bpc'.
    path: the workdir or export directory.
    kind: 'run' or 'export'.
    opt_state: the optimiser state (runs, when asked for), else None.
    model_state: the model's state collections (``TrainState``), or None.
    splits: {split: [N] tokens} an evaluation mode read (``load_splits``),
      else {}.
    train_tokens: the training split's tokens, when a mode read them.
    workdir: where an evaluation mode writes its results ('' otherwise).
  """

  run: spec.Run
  model: Any
  params: Any
  step: int
  vocab: Any
  vocab_size: int
  unit: str
  path: str
  kind: str
  opt_state: Any = None
  model_state: Any = None
  splits: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  train_tokens: Optional[np.ndarray] = None
  workdir: str = ""

  @property
  def settings(self) -> Any:
    """The run's settings."""
    return self.run.settings

  @property
  def mesh(self) -> Mesh:
    """The device mesh the arrays are on."""
    return self.run.mesh

  def scoring(self) -> Any:
    """What a scorer needs to score this model (``Run.scoring``)."""
    return self.run.scoring(
        self.model, unit=self.unit, path=self.path, step=self.step
    )


def export_variables(
    run: spec.Run, files: runfiles.RunFiles, model: Any
) -> tuple[Any, Any, int]:
  """(params, model state or None, step) of an export, for ``model``.

  Raises:
    errors.CheckpointMismatchError: the export holds another model.
  """
  meta = files.read_json(runfiles.EXPORT_FILE)
  layout = convert.Layout.of(meta["signature"])
  abstract, abstract_state = step_lib.abstract_variables(
      model, run.mesh, run.state_collections()
  )
  vocab_size = int(model.cfg.vocab_size)
  checkpointing.check_signature(
      meta["signature"], run.signature(vocab_size), files.path
  )
  params = checkpointing.restore_export_params(
      files.params_dir, abstract, layout
  )
  model_state = None
  if abstract_state is not None:
    model_state = checkpointing.restore_export_params(
        files.model_state_dir, abstract_state, layout
    )
  return params, model_state, int(meta["step"])


def _run_variables(
    run: spec.Run, files: runfiles.RunFiles, model: Any, step: Optional[int]
) -> tuple[Any, Any, int]:
  """(params, model state or None, step) of a workdir's checkpoint."""
  abstract, abstract_state = step_lib.abstract_variables(
      model, run.mesh, run.state_collections()
  )
  ckpt = checkpointing.Checkpointer(
      files.checkpoints,
      keep=1,
      signature=run.signature(model.cfg.vocab_size),
      create=False,
  )
  try:
    candidates = params_lib.chosen_steps(files.path, ckpt.all_steps(), step)
    ckpt.check_compatible(candidates[0])
  finally:
    ckpt.close()
  return params_lib.newest_readable(
      files.checkpoints, candidates, abstract, abstract_state
  )


def restore(
    run: spec.Run,
    files: runfiles.RunFiles,
    *,
    step: Optional[int] = None,
    with_optimizer: bool = False,
) -> Restored:
  """Restores what the run or export at ``files`` saved, on ``run.mesh``.

  Args:
    run: the run (built from the saved config, or from one whose model
      matches it).
    files: the workdir or export (``runfiles.find``).
    step: the checkpoint step of a workdir (None = latest).
    with_optimizer: also restore the optimiser state (workdirs only).

  Raises:
    errors.CheckpointMismatchError: the run describes another model.
  """
  vocab = runfiles.read_vocabulary(files, run.settings.data)
  vocab_size = int(vocab.vocab_size)
  model = run.model(vocab_size)
  opt_state = None
  if files.kind == "export":
    params, model_state, step_ = export_variables(run, files, model)
  elif with_optimizer:
    params, opt_state, model_state, step_ = _with_optimizer(
        run, files, model, step
    )
  else:
    params, model_state, step_ = _run_variables(run, files, model, step)
  console.info("loaded %s %s (step %d)", files.kind, files.path, step_)
  return Restored(
      run=run,
      model=model,
      params=params,
      step=int(step_),
      vocab=vocab,
      vocab_size=vocab_size,
      unit=corpus_lib.metric_unit(run.settings.data.corpus),
      path=files.path,
      kind=files.kind,
      opt_state=opt_state,
      model_state=model_state,
  )


def _with_optimizer(run, files, model, step):
  tx, _ = run.optimizer()
  # A batch row per data shard, so a recurrent memory's template divides.
  rows = sharding_lib.data_parallel(run.mesh)
  sample = {"inputs": jax.ShapeDtypeStruct((rows, 8), np.int32)}
  # The restore's template: shapes and shardings only, nothing allocated.
  _, shapes, shardings = step_lib.abstract_state(
      model, tx, run.mesh, sample, run.state_collections()
  )
  ckpt = checkpointing.Checkpointer(
      files.checkpoints,
      keep=1,
      signature=run.signature(model.cfg.vocab_size),
      create=False,
  )
  try:
    step = ckpt.latest_step() if step is None else int(step)
    abstract = checkpointing.abstract_with_sharding(shapes, shardings)
    # The carried memory is read (in its saved shapes) and dropped.
    abstract = abstract.replace(
        memory=ckpt.saved_memory(step, sharding_lib.replicated(run.mesh))
    )
    restored, _ = ckpt.restore(step, abstract)
  finally:
    ckpt.close()
  return restored.params, restored.opt_state, restored.model_state, step


def write_export(
    restored: Restored,
    out_dir: str,
    dtype: str = "float32",
    config_json: Optional[str] = None,
    **meta: Any,
) -> None:
  """Writes ``restored``'s parameters (cast to ``dtype``) and model state
  as an export in ``out_dir``, its signature and ``meta`` in
  ``export.json``, and ``config_json`` (default the run's) as its
  ``config.json``, whose ``model.param_dtype`` says ``dtype``: the export
  restores in the dtype it was written in."""
  cast = blocks.compute_dtype(dtype)
  saved = json.loads(config_json or restored.run.config_json)
  saved.setdefault("model", {})["param_dtype"] = dtype
  params = jax.tree.map(lambda x: x.astype(cast), restored.params)
  # The running statistics stay float32 (they are not parameters).
  info = {
      "signature": restored.run.signature(restored.vocab_size),
      "step": restored.step,
      "dtype": dtype,
      "source": restored.path,
      **meta,
  }
  runfiles.write_export(
      out_dir,
      json.dumps(saved, indent=2, sort_keys=True),
      restored.vocab,
      params,
      info,
      model_state=restored.model_state,
  )


def export(
    restored: Restored,
    out_dir: str,
    *,
    dtype: str = "float32",
    config_json: Optional[str] = None,
) -> str:
  """Writes a self-contained export of a restored run's parameters.

  Args:
    restored: the run (or export) restored.
    out_dir: the export directory; must not exist yet.
    dtype: 'float32' or 'bfloat16' for the stored parameters.
    config_json: the export's ``config.json`` (default the run's).

  Returns:
    The export directory.

  Raises:
    errors.ConfigError: a bad dtype, or ``out_dir`` exists.
  """
  if dtype not in blocks.DTYPES:
    raise errors.ConfigError(
        f"export dtype must be one of {list(blocks.DTYPES)}, got {dtype!r}"
    )
  out_dir = paths.resolve(out_dir)
  if paths.exists(out_dir):
    raise errors.ConfigError(
        f"{out_dir} already exists: remove it or pass another export directory"
    )
  write_export(restored, out_dir, dtype, config_json)
  return out_dir


def restore_source(run: spec.Run, step: Optional[int] = None) -> Restored:
  """What a mode restores: the run or export in the workdir, else the run
  of ``train.init_from`` (``Run.source``), with the run's settings."""
  return restore(run, runfiles.find(paths.resolve(run.source())), step=step)


def load_splits(
    run: spec.Run,
    splits: tuple[str, ...] = ("valid", "test"),
    train: bool = False,
    source: Optional[str] = None,
) -> Restored:
  """Restores ``source`` (default ``Run.source``) with the run's settings
  and reads the splits (and the training split when ``train``) into it;
  the training batcher is never built.

  Raises:
    errors.MissingRunError: nothing to evaluate.
    errors.CheckpointMismatchError: the run describes another model.
  """
  source = run.source() if source is None else source
  restored = restore(run, runfiles.find(paths.resolve(source)))
  s = run.settings
  corpus = corpus_lib.load_corpus(
      s.data, s.eval, run.workdir, tuple(splits), train=train
  )
  paths.makedirs(run.workdir)  # Results go here.
  console.info(
      "evaluating %s step %d with memories", restored.path, restored.step
  )
  return dataclasses.replace(
      restored,
      splits={x: corpus.splits[x].tokens for x in splits},
      train_tokens=corpus.train.tokens if train else None,
      workdir=run.workdir,
  )
