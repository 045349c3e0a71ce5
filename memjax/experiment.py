"""The experiment layer: build a run from its config; restore any run or export.

Every mode, demo, notebook and benchmark builds through this module, and
nothing but this module and ``memjax.checkpoints.checkpointing`` touches Orbax:

* ``validate_config``, ``make_mesh``, ``load_corpus``, ``make_batcher``,
  ``build_model``, ``make_optimizer``, ``create_state``: a run's parts from
  its config (the train state from ``memjax.run.state``). Evaluation
  reads the splits with ``load_corpus(..., train=False)`` and never builds
  the training batcher.
* ``write_run_files``: what a run saves beside its checkpoints
  (``config.json``, ``vocab.json`` and the word list), so that
  ``load(workdir)`` needs nothing but the directory.
* ``load(path)``: a workdir or an export, restored onto any mesh and device
  count, parameters only unless the optimiser state is asked for.
* ``export(path)``: a self-contained directory (Orbax checkpoint of the
  parameters, config, vocabulary, model signature).
* ``init_params_from``: the parameters two models share, for
  ``train.init_from``.

Layout of a workdir: ``config.json``, ``vocab.json`` (+ ``vocab.txt`` for
word corpora), ``checkpoints/<step>/{state,data,meta}``. Layout of an
export: ``export.json`` (signature, step, dtype, source), ``config.json``,
``vocab.json`` (+ ``vocab.txt``), ``params/`` (Orbax), and ``model_state/``
(Orbax) for a model that carries state (``TrainState.model_state``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from memjax.checkpoints import checkpointing
from memjax.io import console
from memjax import errors
from memjax.run import optim
from memjax.io import paths
from memjax import registry
from memjax.checkpoints import runfiles

# The corpus and validation parts of the layer, re-exported so that callers
# build everything through ``memjax.experiment``.
from memjax.data.corpus import Corpus  # pylint: disable=unused-import
from memjax.data.corpus import check_data
from memjax.data.corpus import cleanup_on_error
from memjax.data.corpus import data_dirs
from memjax.data.corpus import host_batch
from memjax.data.corpus import load_corpus
from memjax.data.corpus import make_batcher
from memjax.data.corpus import metric_unit
from memjax.data.corpus import vocabulary
from memjax.sharding import check_batch_fits
from memjax.validation import make_mesh
from memjax.validation import validate_config
from memjax.models import transformer

# The train state, re-exported so that callers build it through
# ``memjax.experiment``.
from memjax.run.state import TrainState  # pylint: disable=unused-import
from memjax.run.state import abstract_params  # pylint: disable=unused-import
from memjax.run.state import abstract_state  # pylint: disable=unused-import
from memjax.run.state import abstract_variables
from memjax.run.state import create_state
from memjax.run.state import WithVariables

Array = jax.Array
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


# ----------------------------------------------------------------------------
# Model, optimiser, state
# ----------------------------------------------------------------------------


def build_model(mcfg: ml_collections.ConfigDict, vocab_size: int) -> Any:
  """The model described by ``config.model``: its family's builder
  (``registry.MODEL_FAMILIES``, a ``TransformerLM`` for 'decoder_lm')."""
  if mcfg.dtype not in DTYPES:
    raise errors.ConfigError(
        f"model.dtype must be one of {list(DTYPES)}, got {mcfg.dtype!r}"
    )
  build = registry.MODEL_FAMILIES.get(mcfg.family)
  return build(mcfg, vocab_size=vocab_size, dtype=DTYPES[mcfg.dtype])


# Model keys that change how, not what, the model computes: a run may be
# restored with other values (e.g. evaluated in bfloat16, or with remat).
RUNTIME_MODEL_KEYS = ("remat", "dtype", "softmax_chunk")
# Model keys added after signature version 2, with the value every model
# saved before them had: left out of the signature at that value, so runs
# and exports saved earlier keep matching their configs.
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


def model_signature(
    config: ml_collections.ConfigDict, vocab_size: int
) -> dict[str, Any]:
  """What a checkpoint or export must match: the whole model config + V.

  Less ``RUNTIME_MODEL_KEYS``, and less ``LATER_MODEL_KEYS`` while they hold
  their original value; likewise the feed-forward options that the kind
  declares as added later (its class attribute ``LATER_OPTIONS``, {name:
  the value every model saved before it had}).
  """
  m = json.loads(config.model.to_json_best_effort())
  if m.get("feed_forward_options"):
    kind = registry.FEED_FORWARD.get(m.get("feed_forward", "ffn"))
    later = getattr(kind, "LATER_OPTIONS", {})
    m["feed_forward_options"] = {
        k: v
        for k, v in m["feed_forward_options"].items()
        if not (k in later and v == later[k])
    }
  sig = {
      k: v
      for k, v in m.items()
      if k not in RUNTIME_MODEL_KEYS
      and not (k in LATER_MODEL_KEYS and v == LATER_MODEL_KEYS[k])
  }
  sig["vocab_size"] = int(vocab_size)
  return {"model": sig, "name": config.name, "signature_version": 2}


def make_optimizer(
    config: ml_collections.ConfigDict, num_steps: Optional[int] = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimiser, learning-rate schedule) over ``num_steps`` updates."""
  steps = int(config.train.num_steps if num_steps is None else num_steps)
  return optim.make_optimizer(config.optim, steps)


# ----------------------------------------------------------------------------
# Restoring
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class Restored(WithVariables):
  """A trained model restored from a run or an export.

  Attributes:
    config: the config the model was trained with (or the one given).
    model: the TransformerLM.
    params: its parameters, sharded over ``mesh``.
    mesh: the device mesh.
    step: the training step of the parameters.
    vocab: the corpus vocabulary (``seqio.Vocabulary``).
    vocab_size: V.
    unit: 'ppl' or 'bpc'.
    path: the workdir or export directory.
    kind: 'run' or 'export'.
    opt_state: the optimiser state (runs, when asked for), else None.
    model_state: the model's state collections (``TrainState``), or None.
  """

  config: ml_collections.ConfigDict
  model: transformer.TransformerLM
  params: Any
  mesh: Mesh
  step: int
  vocab: Any
  vocab_size: int
  unit: str
  path: str
  kind: str
  opt_state: Any = None
  model_state: Any = None


def load(
    path: str,
    *,
    step: Optional[int] = None,
    config: Optional[ml_collections.ConfigDict] = None,
    mesh: Optional[Mapping[str, int]] = None,
    with_optimizer: bool = False,
) -> Restored:
  """Restores a workdir or an export from what it saved.

  Args:
    path: a training workdir (``config.json`` + ``checkpoints/``) or an
      export directory (``export.json``).
    step: the checkpoint step of a workdir (None = latest).
    config: use this config instead of the saved one (e.g. other evaluation
      settings); its model must match the saved signature.
    mesh: mesh axis sizes, e.g. {'data': 8}; default: all devices on 'data'.
    with_optimizer: also restore the optimiser state (workdirs only).

  Raises:
    errors.MissingRunError: no run or export at ``path``.
    errors.CheckpointMismatchError: ``config`` describes another model.
  """
  path = paths.resolve(path)
  files = runfiles.find(path)
  saved = runfiles.read_config(files)
  config = saved if config is None else config
  vocab = runfiles.read_vocabulary(files, config)
  vocab_size = int(vocab.vocab_size)
  model = build_model(config.model, vocab_size)
  mesh_ = make_mesh(config, mesh or {"data": -1, "fsdp": 1, "tensor": 1})
  signature = model_signature(config, vocab_size)
  abstract, abstract_state_ = abstract_variables(model, mesh_)
  opt_state = model_state = None
  if files.kind == "export":
    checkpointing.check_signature(
        files.read_json("export.json")["signature"], signature, path
    )
    params = checkpointing.restore_export_params(files.params_dir, abstract)
    if abstract_state_ is not None:
      model_state = checkpointing.restore_export_params(
          files.model_state_dir, abstract_state_
      )
    step_ = int(files.read_json("export.json")["step"])
  elif with_optimizer:
    params, opt_state, model_state, step_ = _restore_with_optimizer(
        files, config, model, mesh_, signature, step
    )
  else:
    ckpt = checkpointing.Checkpointer(
        files.checkpoints, keep=1, signature=signature, create=False
    )
    try:
      step_ = ckpt.latest_step() if step is None else int(step)
      ckpt.check_compatible(step_)
    finally:
      ckpt.close()
    params, model_state, step_ = checkpointing.restore_variables(
        files.checkpoints, abstract, step_, abstract_state_
    )
  console.info("loaded %s %s (step %d)", files.kind, path, step_)
  return Restored(
      config=config,
      model=model,
      params=params,
      mesh=mesh_,
      step=int(step_),
      vocab=vocab,
      vocab_size=vocab_size,
      unit=metric_unit(config.data.corpus),
      path=path,
      kind=files.kind,
      opt_state=opt_state,
      model_state=model_state,
  )


def _restore_with_optimizer(files, config, model, mesh, signature, step):
  tx, _ = make_optimizer(config)
  sample = {"inputs": np.zeros((1, 8), np.int32)}
  state, shardings = create_state(
      model, tx, mesh, sample, jax.random.PRNGKey(0)
  )
  ckpt = checkpointing.Checkpointer(
      files.checkpoints, keep=1, signature=signature, create=False
  )
  try:
    step = ckpt.latest_step() if step is None else int(step)
    abstract = checkpointing.abstract_with_sharding(state, shardings)
    abstract = abstract.replace(memory=None)
    restored, _ = ckpt.restore(step, abstract)
  finally:
    ckpt.close()
  return restored.params, restored.opt_state, restored.model_state, step


def export(
    path: str,
    out_dir: Optional[str] = None,
    *,
    step: Optional[int] = None,
    dtype: str = "float32",
) -> str:
  """Writes a self-contained export of a run's parameters.

  Args:
    path: a training workdir (or an export, to re-export in another dtype).
    out_dir: the export directory (default ``<workdir>/export``); must not
      exist yet.
    step: the checkpoint step (None = latest).
    dtype: 'float32' or 'bfloat16' for the stored parameters.

  Returns:
    The export directory.
  """
  if dtype not in DTYPES:
    raise errors.ConfigError(
        f"export dtype must be one of {list(DTYPES)}, got {dtype!r}"
    )
  out_dir = paths.resolve(out_dir or paths.join(path, "export"))
  if paths.exists(out_dir):
    raise errors.ConfigError(
        f"{out_dir} already exists: remove it or pass another export directory"
    )
  restored = load(path, step=step, mesh={"data": -1, "fsdp": 1, "tensor": 1})
  params = jax.tree.map(lambda x: x.astype(DTYPES[dtype]), restored.params)
  # The running statistics stay float32 (they are not parameters).
  meta = {
      "signature": model_signature(restored.config, restored.vocab_size),
      "step": restored.step,
      "dtype": dtype,
      "source": restored.path,
  }
  runfiles.write_export(
      out_dir, restored.config, restored.vocab, params, meta,
      model_state=restored.model_state,
  )  # fmt: skip
  return out_dir


def init_params_from(
    source: str, state: TrainState, shardings: Any, config: Any
) -> TrainState:
  """Takes the parameters this model shares with the run at ``source``.

  Parameters with the same path and shape are restored (so is the model
  state, e.g. BatchNorm statistics, ``_model_state_from``); parameters only
  this model has keep their fresh initialisation (e.g. a memory layer added to a
  trained model); parameters only the source has are left out. Both lists
  are printed.

  Raises:
    errors.MissingRunError: nothing to restore at ``source``.
    errors.CheckpointMismatchError: a shared parameter has another shape,
      or none is shared.
  """
  files = runfiles.find(paths.resolve(source))
  abstract = checkpointing.abstract_with_sharding(
      state.params, shardings.params
  )
  if files.kind == "export":
    saved = checkpointing.export_param_shapes(files.params_dir)
  else:
    saved = checkpointing.param_shapes(files.checkpoints)
  flat = flax.traverse_util.flatten_dict(abstract, sep="/")
  rename = tuple(config.train.get("init_from_map", ()) or ())
  src_of = checkpointing.source_paths(flat, saved, rename, source)
  bad = [
      f"{k}: {tuple(saved[src_of[k]])} -> {tuple(v.shape)}"
      for k, v in flat.items()
      if k in src_of and tuple(saved[src_of[k]]) != tuple(v.shape)
  ]
  if bad:
    raise errors.CheckpointMismatchError(
        f"train.init_from={source}: shared parameters differ in shape "
        f"({'; '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}); the models "
        "must agree on the layers they share"
    )
  sub = flax.traverse_util.unflatten_dict(
      {src_of[k]: flat[k] for k in src_of}, sep="/"
  )
  if files.kind == "export":
    restored = checkpointing.restore_export_params(files.params_dir, sub)
    step = files.read_json("export.json")["step"]
  else:
    restored, step = checkpointing.restore_params(files.checkpoints, sub)
  new_flat = flax.traverse_util.flatten_dict(restored, sep="/")
  params = flax.traverse_util.flatten_dict(state.params, sep="/")
  for k, src in src_of.items():
    params[k] = new_flat[src].astype(params[k].dtype)
  fresh = sorted(set(flat) - set(src_of))
  unused = sorted(set(saved) - set(src_of.values()))
  console.info(
      "initialised %d parameter arrays from %s (step %d); fresh: %s; "
      "not used: %s",
      len(src_of),
      source,
      int(step),
      ", ".join(fresh) or "none",
      ", ".join(unused) or "none",
  )
  return state.replace(
      params=flax.traverse_util.unflatten_dict(params, sep="/"),
      model_state=_model_state_from(files, state, shardings),
  )


def _model_state_from(
    files: runfiles.RunFiles, state: TrainState, shardings: Any
) -> Any:
  """``state``'s model state with what the source holds at the same path
  and shape restored over it (e.g. a pretrained BatchNorm's statistics for
  a fine-tune); the fresh state where the source has none."""
  if state.model_state is None:
    return None
  if files.kind == "export":
    if not paths.isdir(files.model_state_dir):
      return state.model_state
    saved = checkpointing.export_param_shapes(files.model_state_dir)
  else:
    saved = checkpointing.param_shapes(files.checkpoints, item="model_state")
  abstract = checkpointing.abstract_with_sharding(
      state.model_state, shardings.model_state
  )
  flat = flax.traverse_util.flatten_dict(abstract, sep="/")
  shared = {k: v for k, v in flat.items() if saved.get(k) == tuple(v.shape)}
  if not shared:
    return state.model_state
  sub = flax.traverse_util.unflatten_dict(shared, sep="/")
  if files.kind == "export":
    got = checkpointing.restore_export_params(files.model_state_dir, sub)
  else:
    _, got, _ = checkpointing.restore_variables(
        files.checkpoints, None, None, sub
    )
  fresh = flax.traverse_util.flatten_dict(state.model_state, sep="/")
  fresh.update(flax.traverse_util.flatten_dict(got, sep="/"))
  return flax.traverse_util.unflatten_dict(fresh, sep="/")


def source_of(config: ml_collections.ConfigDict, workdir: str) -> str:
  """What a mode restores: ``workdir`` when it holds a run or an export,
  else the run of ``train.init_from``.

  Raises:
    errors.MissingRunError: neither holds one.
  """
  try:
    runfiles.find(workdir)
    return workdir
  except errors.MissingRunError:
    if not config.train.init_from:
      raise
    return config.train.init_from


def load_for_mode(
    config: ml_collections.ConfigDict, workdir: str
) -> tuple[Restored, Corpus]:
  """What an analysis mode needs: the run of ``workdir`` (or of
  ``train.init_from`` when the workdir has none) restored with ``config``,
  and the evaluation splits (no training split, no batcher)."""
  restored = load(source_of(config, workdir), config=config)
  return restored, load_corpus(config, workdir, train=False)
