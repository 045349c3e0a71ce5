"""The experiment layer: build a run from its config; restore any run or export.

Every mode, demo, notebook and benchmark builds through this module, and
nothing but this module and ``memjax.checkpointing`` touches Orbax:

* ``validate_config``, ``make_mesh``, ``load_corpus``, ``make_batcher``,
  ``build_model``, ``make_optimizer``, ``create_state``: a run's parts from
  its config. Evaluation reads the splits with ``load_corpus(...,
  train=False)`` and never builds the training batcher.
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
``vocab.json`` (+ ``vocab.txt``), ``params/`` (Orbax).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from typing import Any, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from memjax import checkpointing
from memjax import console
from memjax import errors
from memjax import optim
from memjax import registry
from memjax import runfiles
from memjax import sharding as sharding_lib
from memjax.data import sources
from memjax.models import transformer

Array = jax.Array
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@flax.struct.dataclass
class TrainState:
  """Everything a step updates.

  Attributes:
    step: scalar int32 update counter.
    params: model parameters.
    opt_state: optimiser state (None when restored for inference).
    memory: carried recurrent memory (per-layer pytrees with a leading batch
      axis) or None for models without recurrence.
  """

  step: Array
  params: Any
  opt_state: Any
  memory: Any = None


# ----------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------

# Positive integers every run needs.
_POSITIVE = (
    "data.seq_len",
    "data.batch_size",
    "data.segments_per_lane",
    "train.num_steps",
    "train.grad_accum",
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "eval.window_len",
    "eval.score_len",
    "eval.batch_size",
    "model.num_layers",
    "model.d_model",
    "model.num_heads",
    "model.head_dim",
    "model.d_ff",
)
_NON_NEGATIVE = (
    "train.eval_every",
    "train.eval_max_windows",
    "eval.max_windows",
    "model.mem_len",
    "optim.warmup_steps",
)


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks the values every run relies on before anything is written.

  Raises:
    errors.ConfigError: naming the key and the accepted values.
  """
  for key in _POSITIVE:
    v = _get(config, key)
    if not isinstance(v, int) or v < 1:
      raise errors.ConfigError(f"{key} must be a positive integer, got {v!r}")
  for key in _NON_NEGATIVE:
    v = _get(config, key)
    if not isinstance(v, int) or v < 0:
      raise errors.ConfigError(f"{key} must be an integer >= 0, got {v!r}")
  if config.eval.score_len > config.eval.window_len:
    raise errors.ConfigError(
        f"eval.score_len {config.eval.score_len} must be <= eval.window_len "
        f"{config.eval.window_len}"
    )
  if config.data.batch_size % config.train.grad_accum:
    raise errors.ConfigError(
        f"data.batch_size {config.data.batch_size} is not divisible by "
        f"train.grad_accum {config.train.grad_accum}"
    )
  if config.model.dtype not in DTYPES:
    raise errors.ConfigError(
        f"model.dtype must be one of {list(DTYPES)}, got {config.model.dtype!r}"
    )
  # ConfigError naming the registered names for an unknown method.
  registry.MODEL_FAMILIES.get(config.model.family)
  registry.ATTENTION.get(config.model.attention)
  registry.FEED_FORWARD.get(config.model.feed_forward)
  registry.OBJECTIVES.get(config.loss.name)
  registry.BATCHERS.get(config.data.batching)
  sources.corpus_spec(config.data.corpus)  # DataError for an unknown corpus.
  optim.group_settings(config.optim)  # ConfigError for a malformed group.


def make_mesh(
    config: ml_collections.ConfigDict, spec: Optional[Mapping[str, int]] = None
) -> Mesh:
  """The device mesh of ``config.mesh``, or of ``spec``: an explicit
  ``spec`` without -1 may use the first devices only (e.g. {'data': 1})."""
  if spec is None:
    return sharding_lib.make_mesh(config.mesh.to_dict())
  sizes = [int(spec.get(a, 1)) for a in sharding_lib.MESH_AXES]
  devices = jax.devices()
  if -1 not in sizes and 0 < int(np.prod(sizes)) < len(devices):
    devices = devices[: int(np.prod(sizes))]
  return sharding_lib.make_mesh(dict(spec), devices)


def check_batch_fits(config: ml_collections.ConfigDict, mesh: Mesh) -> None:
  """Raises MeshError/ConfigError for batches the mesh or lanes cannot split."""
  m = config.model
  if not registry.ATTENTION.get(m.attention).carries_memory(m.mem_len):
    sharding_lib.check_batch(
        mesh,
        config.data.batch_size // config.train.grad_accum,
        "micro-batch size (data.batch_size / train.grad_accum)",
    )
    return
  d = config.data
  if d.batching != "consecutive":
    raise errors.ConfigError(
        f"model.attention={m.attention!r} with model.mem_len={m.mem_len} "
        "carries memory across steps: set data.batching='consecutive' (got "
        f"{d.batching!r})"
    )
  lanes = d.batch_size // max(int(d.segments_per_lane), 1)
  accum = int(config.train.grad_accum)
  if lanes % accum:
    raise errors.ConfigError(
        f"{lanes} lanes (data.batch_size / data.segments_per_lane) are not "
        f"divisible by train.grad_accum {accum}: micro-batches must hold "
        "whole lanes"
    )
  sharding_lib.check_batch(mesh, lanes // accum, "lanes per micro-batch")


# ----------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------


def metric_unit(corpus: str) -> str:
  """'bpc' for byte corpora (enwik8, text8), 'ppl' for word corpora."""
  return "bpc" if sources.corpus_spec(corpus).level == "byte" else "ppl"


@dataclasses.dataclass
class Corpus:
  """The token streams of one corpus.

  Attributes:
    name: canonical corpus name.
    vocab_size: V.
    unit: 'ppl' (words) or 'bpc' (bytes).
    train: the training ``tasks.TokenStream`` (None when not read).
    splits: evaluation streams by split name.
    cache_dir: where vocabularies, token streams and packings are cached.
  """

  name: str
  vocab_size: int
  unit: str
  train: Any
  splits: dict[str, Any]
  cache_dir: str


def data_dirs(
    config: ml_collections.ConfigDict, workdir: str
) -> tuple[str, str]:
  """(data_dir, cache_dir) of a run; nothing is created."""
  d = config.data
  data_dir = d.data_dir or sources.default_data_dir(d.corpus)
  return data_dir, d.cache_dir or os.path.join(workdir, "cache")


@contextlib.contextmanager
def cleanup_on_error(workdir: str):
  """Removes ``workdir`` again if it is new and the block raises a UserError.

  Set-up reads and caches data in ``<workdir>/cache`` before it can know
  that, e.g., a corpus file is not UTF-8; a workdir that did not exist
  before is then removed, so bad input leaves nothing behind. An existing
  workdir is never touched.
  """
  existed = os.path.exists(workdir)
  try:
    yield
  except errors.UserError:
    if not existed and os.path.isdir(workdir) and jax.process_index() == 0:
      shutil.rmtree(workdir, ignore_errors=True)
    raise


def check_data(
    config: ml_collections.ConfigDict, splits: tuple[str, ...], train: bool
) -> None:
  """Raises DataError if a needed split file is missing; writes nothing."""
  data_dir = config.data.data_dir or sources.default_data_dir(
      config.data.corpus
  )
  for split in (("train",) if train else ()) + tuple(splits):
    sources.split_path(config.data.corpus, data_dir, split)


def load_corpus(
    config: ml_collections.ConfigDict,
    workdir: str,
    splits: Optional[tuple[str, ...]] = None,
    train: bool = True,
) -> Corpus:
  """Reads the corpus through its SeqIO task (token streams are cached).

  Args:
    config: the run's config.
    workdir: the run's directory (default cache ``<workdir>/cache``).
    splits: evaluation splits to read (default ``eval.splits``).
    train: also read the training split (training, unigram baselines).
  """
  from memjax.data import tasks  # pylint: disable=g-import-not-at-top
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  splits = tuple(config.eval.splits if splits is None else splits)
  check_data(config, splits, train)
  data_dir, cache_dir = data_dirs(config, workdir)
  os.makedirs(cache_dir, exist_ok=True)
  corpus = config.data.corpus
  train_stream = (
      tasks.load_token_stream(corpus, data_dir, "train", cache_dir)
      if train
      else None
  )
  streams_ = {
      s: tasks.load_token_stream(corpus, data_dir, s, cache_dir) for s in splits
  }
  vocab = vocab_lib.get_vocabulary(corpus, data_dir, cache_dir)
  return Corpus(
      sources.canonical_corpus(corpus),
      int(vocab.vocab_size),
      metric_unit(corpus),
      train_stream,
      streams_,
      cache_dir,
  )


def vocabulary(config: ml_collections.ConfigDict, workdir: str) -> Any:
  """The corpus vocabulary of a run's config (built or read from the cache)."""
  from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  data_dir, cache_dir = data_dirs(config, workdir)
  return vocab_lib.get_vocabulary(config.data.corpus, data_dir, cache_dir)


def make_batcher(
    config: ml_collections.ConfigDict, train: Any, cache_dir: str
) -> Any:
  """The training batcher of ``data.batching`` (a pure function of the step).

  The batcher registered under that name in ``registry.BATCHERS`` is built
  from the config, the training ``tasks.TokenStream`` and the cache
  directory.
  """
  from memjax.data import packing  # pylint: disable=g-import-not-at-top

  packing.check_trime_batching(config)
  make = registry.BATCHERS.get(config.data.batching)
  return make(config, train, cache_dir)


def host_batch(batcher: Any, step: int) -> dict[str, np.ndarray]:
  """The global batch of a step with only the arrays the step consumes."""
  b = batcher.batch(step)
  keep = ("inputs", "targets", "weights", "reset", "lane_id")
  return {k: np.asarray(v) for k, v in b.items() if k in keep}


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
    "feed_forward": "ffn",
    "feed_forward_options": {},
    "norm_position": "pre",
    "norm_epsilon": 1e-6,
}


def model_signature(
    config: ml_collections.ConfigDict, vocab_size: int
) -> dict[str, Any]:
  """What a checkpoint or export must match: the whole model config + V.

  Less ``RUNTIME_MODEL_KEYS``, and less ``LATER_MODEL_KEYS`` while they hold
  their original value.
  """
  m = json.loads(config.model.to_json_best_effort())
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


def _init_variables(model, seq_len: int, key: Array) -> Any:
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  return model.init(
      {"params": key, "dropout": key}, tokens, tokens, deterministic=True
  )["params"]


def create_state(
    model,
    tx: Optional[optax.GradientTransformation],
    mesh: Mesh,
    sample: dict[str, np.ndarray],
    rng: Array,
) -> tuple[TrainState, Any]:
  """Initialises the train state directly on the mesh.

  Args:
    model: the TransformerLM.
    tx: the optimiser, or None for parameters only (``opt_state`` None).
    mesh: device mesh.
    sample: a batch ('inputs' [B, L]; 'reset' [lanes] for lane batches).
    rng: initialisation key.

  Returns:
    (state, state_shardings) where the shardings follow the model's logical
    axis names through ``sharding.LOGICAL_RULES``.
  """
  seq_len = sample["inputs"].shape[1]
  # The carried memory has one row per lane ('reset' is [lanes]).
  batch = (
      sample["reset"].shape[0]
      if "reset" in sample
      else sample["inputs"].shape[0]
  )

  def init_fn(key):
    params = _init_variables(model, seq_len, key)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=None if tx is None else tx.init(params),
        memory=model.init_memory(batch),
    )

  with nn.logical_axis_rules(sharding_lib.LOGICAL_RULES):
    abstract = jax.eval_shape(init_fn, rng)
    logical = nn.get_partition_spec(abstract)
    shardings = sharding_lib.logical_sharding(mesh, logical)
  if abstract.memory is not None:
    mem_shard = jax.tree.map(
        lambda x: sharding_lib.batch_sharding(mesh, x.ndim),
        nn.meta.unbox(abstract.memory),
    )
    shardings = shardings.replace(memory=mem_shard)
  with sharding_lib.mesh_rules(mesh):
    state = jax.jit(
        lambda k: nn.meta.unbox(init_fn(k)), out_shardings=shardings
    )(rng)
  return state, shardings


def abstract_params(model, mesh: Mesh, seq_len: int = 8) -> Any:
  """The parameters' shapes and shardings, as ``jax.ShapeDtypeStruct``."""
  key = jax.random.PRNGKey(0)
  with nn.logical_axis_rules(sharding_lib.LOGICAL_RULES):
    abstract = jax.eval_shape(lambda k: _init_variables(model, seq_len, k), key)
    shardings = sharding_lib.logical_sharding(
        mesh, nn.get_partition_spec(abstract)
    )
  return checkpointing.abstract_with_sharding(
      nn.meta.unbox(abstract), shardings
  )


# ----------------------------------------------------------------------------
# Restoring
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class Restored:
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
  path = os.path.abspath(path)
  files = runfiles.find(path)
  saved = runfiles.read_config(files)
  config = saved if config is None else config
  vocab = runfiles.read_vocabulary(files, config)
  vocab_size = int(vocab.vocab_size)
  model = build_model(config.model, vocab_size)
  mesh_ = make_mesh(config, mesh or {"data": -1, "fsdp": 1, "tensor": 1})
  signature = model_signature(config, vocab_size)
  abstract = abstract_params(model, mesh_)
  opt_state = None
  if files.kind == "export":
    checkpointing.check_signature(
        files.read_json("export.json")["signature"], signature, path
    )
    params = checkpointing.restore_export_params(files.params_dir, abstract)
    step_ = int(files.read_json("export.json")["step"])
  elif with_optimizer:
    params, opt_state, step_ = _restore_with_optimizer(
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
    params, step_ = checkpointing.restore_params(
        files.checkpoints, abstract, step_
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
  return restored.params, restored.opt_state, step


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
  out_dir = os.path.abspath(out_dir or os.path.join(path, "export"))
  if os.path.exists(out_dir):
    raise errors.ConfigError(
        f"{out_dir} already exists: remove it or pass another export directory"
    )
  restored = load(path, step=step, mesh={"data": -1, "fsdp": 1, "tensor": 1})
  params = jax.tree.map(lambda x: x.astype(DTYPES[dtype]), restored.params)
  tmp = out_dir + ".partial"
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  os.makedirs(tmp)
  runfiles.write_run_files(tmp, restored.config, restored.vocab)
  checkpointing.save_export_params(os.path.join(tmp, "params"), params)
  meta = {
      "signature": model_signature(restored.config, restored.vocab_size),
      "step": restored.step,
      "dtype": dtype,
      "source": restored.path,
      "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
  }
  runfiles.write_json(os.path.join(tmp, "export.json"), meta)
  os.replace(tmp, out_dir)
  return out_dir


def init_params_from(
    source: str, state: TrainState, shardings: Any, config: Any
) -> TrainState:
  """Takes the parameters this model shares with the run at ``source``.

  Parameters with the same path and shape are restored; parameters only this
  model has keep their fresh initialisation (e.g. a memory layer added to a
  trained model); parameters only the source has are left out. Both lists
  are printed.

  Raises:
    errors.MissingRunError: nothing to restore at ``source``.
    errors.CheckpointMismatchError: a shared parameter has another shape.
  """
  files = runfiles.find(os.path.abspath(source))
  abstract = checkpointing.abstract_with_sharding(
      state.params, shardings.params
  )
  if files.kind == "export":
    saved = checkpointing.export_param_shapes(files.params_dir)
  else:
    saved = checkpointing.param_shapes(files.checkpoints)
  flat = flax.traverse_util.flatten_dict(abstract, sep="/")
  shared = {k: v for k, v in flat.items() if k in saved}
  bad = [
      f"{k}: {tuple(saved[k])} -> {tuple(v.shape)}"
      for k, v in shared.items()
      if tuple(saved[k]) != tuple(v.shape)
  ]
  if bad:
    raise errors.CheckpointMismatchError(
        f"train.init_from={source}: shared parameters differ in shape "
        f"({'; '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}); the models "
        "must agree on the layers they share"
    )
  sub = flax.traverse_util.unflatten_dict(shared, sep="/")
  if files.kind == "export":
    restored = checkpointing.restore_export_params(files.params_dir, sub)
    step = files.read_json("export.json")["step"]
  else:
    restored, step = checkpointing.restore_params(files.checkpoints, sub)
  new = dict(flat)
  new_flat = flax.traverse_util.flatten_dict(restored, sep="/")
  params = flax.traverse_util.flatten_dict(state.params, sep="/")
  for k in new:
    if k in new_flat:
      params[k] = new_flat[k].astype(params[k].dtype)
  fresh = sorted(set(flat) - set(saved))
  unused = sorted(set(saved) - set(flat))
  console.info(
      "initialised %d parameter arrays from %s (step %d); fresh: %s; "
      "not used: %s",
      len(shared),
      source,
      int(step),
      ", ".join(fresh) or "none",
      ", ".join(unused) or "none",
  )
  return state.replace(
      params=flax.traverse_util.unflatten_dict(params, sep="/")
  )


def load_for_mode(
    config: ml_collections.ConfigDict, workdir: str
) -> tuple[Restored, Corpus]:
  """What an analysis mode needs: the run of ``workdir`` (or of
  ``train.init_from`` when the workdir has none) restored with ``config``,
  and the evaluation splits (no training split, no batcher)."""
  source = workdir
  try:
    runfiles.find(workdir)
  except errors.MissingRunError:
    if not config.train.init_from:
      raise
    source = config.train.init_from
  restored = load(source, config=config)
  return restored, load_corpus(config, workdir, train=False)
