"""The training loop: mesh, data, model, state, step, checkpoints, loop.

``train_and_evaluate(config, workdir)`` trains with periodic evaluation and
checkpoints, resumes automatically from ``<workdir>/checkpoints``, evaluates
the final model on valid and test, and writes ``<workdir>/results.json`` next
to the TensorBoard events.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from clu import metric_writers
from jax.sharding import Mesh

from memjax import checkpointing
from memjax import console
from memjax import evaluate
from memjax import losses
from memjax import optim
from memjax import recurrent_eval
from memjax import sharding as sharding_lib
from memjax.data import packing
from memjax.data import sources
from memjax.data import streams
from memjax.data import tasks
from memjax.models import transformer

Array = jax.Array


class NonFiniteLossError(FloatingPointError):
  """The loss or the gradient norm became NaN or infinite."""


@flax.struct.dataclass
class TrainState:
  """Everything a step updates.

  Attributes:
    step: scalar int32 update counter.
    params: model parameters.
    opt_state: optimiser state.
    memory: carried recurrent memory (per-layer pytrees with a leading batch
      axis) or None for models without recurrence.
  """

  step: Array
  params: Any
  opt_state: Any
  memory: Any = None


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------


def build_model(
    mcfg: ml_collections.ConfigDict, vocab_size: int
) -> transformer.TransformerLM:
  """The TransformerLM described by ``config.model``."""
  dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
  if mcfg.dtype not in dtypes:
    raise ValueError(
        f"model.dtype must be one of {list(dtypes)}, got {mcfg.dtype!r}"
    )
  return transformer.TransformerLM(
      vocab_size=vocab_size,
      num_layers=mcfg.num_layers,
      d_model=mcfg.d_model,
      num_heads=mcfg.num_heads,
      head_dim=mcfg.head_dim,
      d_ff=mcfg.d_ff,
      cutoffs=tuple(mcfg.cutoffs),
      adaptive_factor=mcfg.adaptive_factor,
      scale_embedding=mcfg.scale_embedding,
      dropout_rate=mcfg.dropout,
      attention_dropout_rate=mcfg.attention_dropout,
      attention=mcfg.attention,
      attention_options=(
          mcfg.attention_options.to_dict() if mcfg.attention_options else None
      ),
      mem_len=mcfg.mem_len,
      max_len=mcfg.max_len,
      remat=mcfg.remat,
      dtype=dtypes[mcfg.dtype],
      softmax_chunk=mcfg.softmax_chunk,
  )


def model_signature(config: ml_collections.ConfigDict, vocab_size: int) -> dict:
  """What a checkpoint must match to be restored into this run."""
  m = config.model.to_dict()
  sig = {
      k: m[k]
      for k in (
          "num_layers",
          "d_model",
          "num_heads",
          "head_dim",
          "d_ff",
          "cutoffs",
          "adaptive_factor",
          "attention",
          "mem_len",
      )
  }
  sig["cutoffs"] = list(sig["cutoffs"])
  sig["vocab_size"] = int(vocab_size)
  return {"model": sig, "name": config.name}


# ----------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class Data:
  """The token streams of one corpus and its training batcher."""

  corpus: str
  vocab_size: int
  train: Any  # tasks.TokenStream
  splits: dict[str, Any]
  batcher: Any


def load_data(config: ml_collections.ConfigDict, workdir: str) -> Data:
  """Reads the corpus through its SeqIO task and builds the batcher."""
  dcfg = config.data
  data_dir = dcfg.data_dir or sources.default_data_dir(dcfg.corpus)
  cache_dir = dcfg.cache_dir or os.path.join(workdir, "cache")
  os.makedirs(cache_dir, exist_ok=True)
  train = tasks.load_token_stream(dcfg.corpus, data_dir, "train", cache_dir)
  splits = {
      s: tasks.load_token_stream(dcfg.corpus, data_dir, s, cache_dir)
      for s in config.eval.splits
  }
  batcher = make_batcher(config, train, cache_dir)
  return Data(dcfg.corpus, train.vocab_size, train, splits, batcher)


def make_batcher(
    config: ml_collections.ConfigDict,
    train: Any,
    cache_dir: Optional[str] = None,
) -> Any:
  """Stateless-by-step batcher of ``config.data.batching``."""
  d = config.data
  packing.check_trime_batching(config)
  if d.batching in packing.BATCHINGS:
    return packing.make_batcher(config, train, cache_dir or "")
  if d.batching == "random":
    return streams.RandomSegments(
        train.tokens, d.seq_len, d.batch_size, seed=config.seed
    )
  if d.batching == "consecutive":
    m = int(d.segments_per_lane)
    if d.batch_size % m:
      raise ValueError(
          f"data.batch_size {d.batch_size} is not a multiple of "
          f"data.segments_per_lane {m}"
      )
    return streams.ConsecutiveSegments(
        train.tokens,
        d.seq_len,
        lanes=d.batch_size // m,
        segments_per_lane=m,
        seed=config.seed,
        doc_starts=train.doc_starts,
    )
  raise ValueError(
      f"unknown data.batching {d.batching!r}; use random, "
      f"consecutive or one of {packing.BATCHINGS}"
  )


def host_batch(batcher: Any, step: int) -> dict[str, np.ndarray]:
  """The global batch of a step with only the arrays the step consumes."""
  b = batcher.batch(step)
  keep = ("inputs", "targets", "weights", "reset", "lane_id")
  return {k: np.asarray(v) for k, v in b.items() if k in keep}


# ----------------------------------------------------------------------------
# State
# ----------------------------------------------------------------------------


def init_memory(model: transformer.TransformerLM, batch_size: int) -> Any:
  """Initial recurrent memory for models that carry one, else None."""
  return model.init_memory(batch_size)


def create_state(
    model, tx, mesh: Mesh, sample: dict[str, np.ndarray], rng: Array
) -> tuple[TrainState, Any]:
  """Initialises the train state directly on the mesh.

  Returns:
    (state, state_shardings) where the shardings follow the model's logical
    axis names through ``sharding.LOGICAL_RULES``.
  """
  inputs = jnp.asarray(sample["inputs"][:1])
  targets = jnp.asarray(sample["targets"][:1])
  # The carried memory has one row per lane ('reset' is [lanes]).
  batch = (
      sample["reset"].shape[0]
      if "reset" in sample
      else sample["inputs"].shape[0]
  )

  def init_fn(key):
    variables = model.init(
        {"params": key, "dropout": key}, inputs, targets, deterministic=True
    )
    params = variables["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        memory=init_memory(model, batch),
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


# ----------------------------------------------------------------------------
# Step
# ----------------------------------------------------------------------------


def _split_micro(x: Array, n: int) -> Array:
  return x.reshape((n, x.shape[0] // n) + x.shape[1:])


def run_lane_segments(
    model,
    params: Any,
    batch: dict[str, Array],
    memory: Any,
    segments_per_lane: int,
    *,
    rng: Array,
    deterministic: bool = False,
) -> transformer.LMOutput:
  """Runs the m consecutive segments of every lane in order, carrying memory.

  A consecutive batch holds ``lanes * m`` rows, lane-major (lane 0's m
  segments, then lane 1's, ...). Segment k of every lane is run with the
  memory left by segment k - 1 (``jax.lax.scan`` over the m segments), and
  the outputs are stacked back into the batch's row order, so a loss sees
  each lane's whole stream with gradients into every segment's outputs.

  Args:
    model: a ``TransformerLM`` that carries memory.
    params: its parameters.
    batch: 'inputs', 'targets' [lanes * m, L] int32.
    memory: the memory of the lanes ([lanes, ...] leaves).
    segments_per_lane: m.
    rng: dropout key; segment k uses ``fold_in(rng, k)``.
    deterministic: disables dropout.

  Returns:
    ``LMOutput`` with [lanes * m, L(, D)] arrays in the batch's row order
    and the memory after each lane's last segment.
  """
  m = segments_per_lane

  def to_segments(x):  # [lanes * m, ...] -> [m, lanes, ...]
    return jnp.swapaxes(x.reshape((-1, m) + x.shape[1:]), 0, 1)

  def to_rows(x):  # [m, lanes, ...] -> [lanes * m, ...]
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape((-1,) + x.shape[2:])

  def body(mem, xs):
    inputs, targets, k = xs
    out = model.apply(
        {"params": params},
        inputs,
        targets,
        memory=mem,
        deterministic=deterministic,
        rngs={"dropout": jax.random.fold_in(rng, k)},
    )
    return out.memory, out.replace(memory=None)

  new_memory, outs = jax.lax.scan(
      body,
      memory,
      (
          to_segments(batch["inputs"]),
          to_segments(batch["targets"]),
          jnp.arange(m),
      ),
  )
  return jax.tree.map(to_rows, outs).replace(memory=new_memory)


def make_train_step(
    model,
    tx,
    loss_fn: losses.LossFn,
    *,
    grad_accum: int,
    state_shardings: Any,
    mesh: Mesh,
    segments_per_lane: int = 1,
) -> Callable:
  """Builds the jitted ``(state, batch, rng) -> (state, metrics)``.

  Gradients are accumulated over ``grad_accum`` micro-batches with
  ``lax.scan``. A step whose loss or gradient norm is not finite leaves the
  state unchanged and reports ``finite = 0``, so the host can stop and name
  the step. The state argument is donated. When the state carries a memory
  and ``segments_per_lane`` m > 1, the m segments of each lane run in order
  (``run_lane_segments``); micro-batches then hold whole lanes.
  """

  def forward(p, mb, memory, rng):
    if memory is not None and segments_per_lane > 1:
      return run_lane_segments(model, p, mb, memory, segments_per_lane, rng=rng)
    return model.apply(
        {"params": p},
        mb["inputs"],
        mb["targets"],
        memory=memory,
        deterministic=False,
        rngs={"dropout": rng},
    )

  def micro_grads(params, mb, memory, rng, step):
    def f(p):
      out = forward(p, mb, memory, rng)
      loss, metrics = loss_fn(out, mb, step=step, rng=rng)
      # Scale so that summing micro-batch gradients gives the batch mean.
      return loss * metrics["tokens"], (metrics, out.memory)

    (_, (metrics, new_memory)), grads = jax.value_and_grad(f, has_aux=True)(
        params
    )
    return grads, metrics, new_memory

  def step_fn(state: TrainState, batch: dict[str, Array], rng: Array):
    rng = jax.random.fold_in(rng, state.step)
    memory = state.memory
    if memory is not None and "reset" in batch:
      memory = model.reset_memory(memory, batch["reset"])
    if grad_accum == 1:
      grads, metrics, new_memory = micro_grads(
          state.params, batch, memory, rng, state.step
      )
    else:
      micro = jax.tree.map(
          lambda x: _split_micro(x, grad_accum),
          {k: v for k, v in batch.items() if k != "reset"},
      )
      mem_micro = (
          None
          if memory is None
          else jax.tree.map(lambda x: _split_micro(x, grad_accum), memory)
      )
      zeros = jax.tree.map(jnp.zeros_like, state.params)

      def body(acc, xs):
        mb, mem, i = xs
        g, m, new_mem = micro_grads(
            state.params, mb, mem, jax.random.fold_in(rng, i), state.step
        )
        acc_g, acc_m = acc
        return (
            jax.tree.map(jnp.add, acc_g, g),
            jax.tree.map(jnp.add, acc_m, m),
        ), new_mem

      init_m = {
          "nll_sum": jnp.zeros((), jnp.float32),
          "tokens": jnp.zeros((), jnp.float32),
      }
      init_m = jax.eval_shape(
          lambda: micro_grads(
              state.params,
              jax.tree.map(lambda x: x[0], micro),
              None
              if mem_micro is None
              else jax.tree.map(lambda x: x[0], mem_micro),
              rng,
              state.step,
          )[1]
      )
      init_m = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), init_m)
      (grads, metrics), new_mem = jax.lax.scan(
          body, (zeros, init_m), (micro, mem_micro, jnp.arange(grad_accum))
      )
      new_memory = (
          None
          if new_mem is None
          else jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), new_mem)
      )
    tokens = jnp.maximum(metrics["tokens"], 1.0)
    grads = jax.tree.map(lambda g: g / tokens, grads)
    loss = metrics["nll_sum"] / tokens
    gnorm = optax.tree.norm(grads)
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
    keep = lambda new, old: jax.tree.map(
        lambda a, b: jnp.where(finite, a, b), new, old
    )
    new_state = TrainState(
        step=state.step + 1,
        params=keep(new_params, state.params),
        opt_state=keep(new_opt, state.opt_state),
        memory=new_memory,
    )
    out = {k: v for k, v in metrics.items()}
    out.update(loss=loss, grad_norm=gnorm, finite=finite.astype(jnp.float32))
    return new_state, out

  return sharding_lib.under_mesh(
      jax.jit(
          step_fn, donate_argnums=(0,), out_shardings=(state_shardings, None)
      ),
      mesh,
  )


# ----------------------------------------------------------------------------
# Loop
# ----------------------------------------------------------------------------


def _config_json(config: ml_collections.ConfigDict) -> str:
  return config.to_json_best_effort(indent=2, sort_keys=True)


def init_params_from(
    directory: str, state: TrainState, shardings: Any
) -> TrainState:
  """Replaces ``state.params`` with those of another run's checkpoint."""
  abstract = checkpointing.abstract_with_sharding(
      state.params, shardings.params
  )
  params, step = checkpointing.restore_params(directory, abstract)
  console.info("initialised parameters from %s (step %d)", directory, step)
  return state.replace(params=params)


class ProgressMeter:
  """Console progress: loss, tokens/s and an ETA from recent steps."""

  def __init__(self, total_steps: int, tokens_per_step: int, start_step: int):
    self.total = total_steps
    self.tokens_per_step = tokens_per_step
    self.last_step, self.last_time = start_step, time.time()
    self.first_time = self.last_time
    self.first_step = start_step

  def update(self, step: int) -> dict[str, float]:
    now = time.time()
    dt = max(now - self.last_time, 1e-9)
    steps = step - self.last_step
    tps = steps * self.tokens_per_step / dt
    sps = steps / dt
    eta = (self.total - step) / max(sps, 1e-9)
    self.last_step, self.last_time = step, now
    return {"tokens_per_s": tps, "steps_per_s": sps, "eta_s": eta}

  def overall_tokens_per_s(self, step: int) -> float:
    dt = max(time.time() - self.first_time, 1e-9)
    return (step - self.first_step) * self.tokens_per_step / dt


def _log_steps(
    pending: list[tuple[int, dict]],
    meter: ProgressMeter,
    writer: Any,
    schedule: Callable,
    log_path: str,
    num_steps: int,
    ckpt: checkpointing.Checkpointer,
) -> None:
  """Fetches the metrics of the steps since the last log and reports them.

  Raises:
    NonFiniteLossError: naming the first step whose loss or gradient was not
      finite (that update was skipped; checkpoints are left as they were).
  """
  fetched = jax.device_get([m for _, m in pending])
  # Every process checks the metrics; process 0 alone writes the log.
  with open(log_path if jax.process_index() == 0 else os.devnull, "a") as f:
    for (s, _), m in zip(pending, fetched):
      if not m["finite"]:
        ckpt.close()
        raise NonFiniteLossError(
            f"non-finite loss or gradient at step {s + 1} (loss "
            f"{float(m['loss'])}, grad norm {float(m['grad_norm'])}); the "
            f"update was skipped and the checkpoints in {ckpt.directory} are "
            "intact: lower optim.learning_rate or set optim.clip_norm"
        )
      f.write(
          json.dumps(
              {
                  "step": s + 1,
                  "loss": float(m["loss"]),
                  "grad_norm": float(m["grad_norm"]),
              }
          )
          + "\n"
      )
  done = pending[-1][0] + 1
  last = fetched[-1]
  mean_loss = float(np.mean([m["loss"] for m in fetched]))
  speed = meter.update(done)
  scalars = {
      "train/loss": mean_loss,
      "train/grad_norm": float(last["grad_norm"]),
      "train/lr": float(schedule(done - 1)),
      "train/tokens_per_s": speed["tokens_per_s"],
  }
  for k, v in losses.summarize_aux(last).items():
    scalars[f"train/{k}"] = v
  writer.write_scalars(done, scalars)
  console.info(
      "step %d/%d  loss %.4f  ppl %.1f  lr %.2e  %.0f tok/s  ETA %s",
      done,
      num_steps,
      mean_loss,
      np.exp(min(mean_loss, 50)),
      scalars["train/lr"],
      speed["tokens_per_s"],
      time.strftime("%H:%M:%S", time.gmtime(speed["eta_s"])),
  )


def check_recurrent_config(
    config: ml_collections.ConfigDict, mesh: Mesh
) -> None:
  """Raises ValueError/MeshError for a memory model the data cannot feed.

  A model that carries memory needs consecutive batches (each row continues
  a lane), micro-batches of whole lanes, and lanes that split evenly over the
  data-parallel devices (the memory is sharded with the batch).
  """
  m = config.model
  if m.attention not in transformer.RECURRENT_KINDS or m.mem_len <= 0:
    return
  d = config.data
  if d.batching != "consecutive":
    raise ValueError(
        f"model.attention={m.attention!r} with model.mem_len={m.mem_len} "
        f"carries memory across steps: set data.batching='consecutive' (got "
        f"{d.batching!r})"
    )
  lanes = d.batch_size // max(int(d.segments_per_lane), 1)
  accum = int(config.train.grad_accum)
  if lanes % accum:
    raise ValueError(
        f"{lanes} lanes (data.batch_size / data.segments_per_lane) are not "
        f"divisible by train.grad_accum {accum}: micro-batches must hold "
        "whole lanes"
    )
  sharding_lib.check_batch(mesh, lanes // accum, "lanes per micro-batch")


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    mode: str = "train",
    hooks: tuple[Callable[[int, TrainState], None], ...] = (),
) -> dict[str, Any]:
  """Trains (``mode='train'``) or only evaluates (``mode='eval'``).

  Args:
    config: the experiment configuration.
    workdir: output directory (checkpoints, TensorBoard events, results.json).
    mode: 'train' or 'eval' (restores the latest checkpoint of the workdir,
      or of ``train.init_from`` if the workdir has none).
    hooks: callables ``hook(step, state)`` run after each update and its
      checkpoint (profilers, custom logging, tests that interrupt a run).

  Returns:
    The results written to ``results.json``.
  """
  os.makedirs(workdir, exist_ok=True)
  # ---------------------------------------------------------------- mesh
  mesh = sharding_lib.make_mesh(config.mesh.to_dict())
  sharding_lib.check_batch(
      mesh,
      config.data.batch_size // config.train.grad_accum,
      "micro-batch size (data.batch_size / train.grad_accum)",
  )
  if config.data.batch_size % config.train.grad_accum:
    raise ValueError(
        f"data.batch_size {config.data.batch_size} is not divisible by "
        f"train.grad_accum {config.train.grad_accum}"
    )
  console.info(
      "mesh: %s over %d %s devices",
      dict(mesh.shape),
      mesh.size,
      jax.devices()[0].platform,
  )
  check_recurrent_config(config, mesh)

  # ---------------------------------------------------------------- data
  data = load_data(config, workdir)
  unit = evaluate.metric_unit(data.corpus)
  console.info(
      "corpus %s: vocab %d, train %d tokens, %s",
      data.corpus,
      data.vocab_size,
      len(data.train.tokens),
      ", ".join(f"{k} {len(v.tokens)}" for k, v in data.splits.items()),
  )

  # ---------------------------------------------------------------- model
  model = build_model(config.model, data.vocab_size)
  num_steps = int(config.train.num_steps)
  tx, schedule = optim.make_optimizer(config.optim, num_steps)
  loss_fn = losses.make_loss(config.loss, num_steps, seed=config.seed)

  # ---------------------------------------------------------------- state
  sample = host_batch(data.batcher, 0)
  rng = jax.random.PRNGKey(config.seed)
  state, shardings = create_state(model, tx, mesh, sample, rng)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  console.info("model: %s parameters", f"{n_params:,}")

  # ---------------------------------------------------------------- ckpt
  signature = model_signature(config, data.vocab_size)
  ckpt = checkpointing.Checkpointer(
      os.path.join(workdir, "checkpoints"),
      keep=config.train.keep_checkpoints,
      signature=signature,
  )
  latest = ckpt.latest_step()
  start_step = 0
  if latest is not None:
    abstract = checkpointing.abstract_with_sharding(state, shardings)
    state, position = ckpt.restore(latest, abstract)
    start_step = int(position["step"])
    console.info("resumed from %s at step %d", ckpt.directory, start_step)
  elif config.train.init_from:
    state = init_params_from(config.train.init_from, state, shardings)
  elif mode == "eval":
    raise FileNotFoundError(
        f"--mode=eval needs a checkpoint: none in {ckpt.directory} and no "
        "--config.train.init_from given"
    )
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(_config_json(config))

  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0
  )
  eval_step = sharding_lib.under_mesh(evaluate.make_eval_step(model), mesh)
  # Models with memory are scored over whole streams, carrying it.
  stream_eval = (
      recurrent_eval.evaluator_for(config, model, mesh)
      if model.carries_memory()
      else None
  )

  def run_eval(step: int, max_windows: int, prefix: str) -> dict[str, Any]:
    res = {}
    for split, stream in data.splits.items():
      desc = f"{prefix}{split} @ step {step}"
      if stream_eval is not None:
        r = stream_eval.evaluate(
            state.params,
            stream.tokens,
            unit=unit,
            max_segments=max_windows,
            desc=desc,
        )
      else:
        r = evaluate.evaluate_tokens(
            eval_step,
            state.params,
            stream.tokens,
            window_len=config.eval.window_len,
            score_len=config.eval.score_len,
            batch_size=config.eval.batch_size,
            mesh=mesh,
            unit=unit,
            max_windows=max_windows,
            desc=desc,
        )
      res[split] = r
      writer.write_scalars(
          step,
          {f"{prefix}{split}/{k}": v for k, v in r.items() if k != "tokens"},
      )
    return res

  # ---------------------------------------------------------------- loop
  tokens_per_step = config.data.batch_size * config.data.seq_len
  train_tps = None
  if mode == "train" and start_step < num_steps:
    train_step = make_train_step(
        model,
        tx,
        loss_fn,
        grad_accum=config.train.grad_accum,
        state_shardings=shardings,
        mesh=mesh,
        segments_per_lane=int(config.data.segments_per_lane),
    )
    meter = ProgressMeter(num_steps, tokens_per_step, start_step)
    step_rng = jax.random.PRNGKey(config.seed + 1)
    pending: list[tuple[int, dict]] = []
    console.info(
        "training from step %d to %d (%d tokens per step)",
        start_step,
        num_steps,
        tokens_per_step,
    )
    log_path = os.path.join(workdir, "train_log.jsonl")
    try:
      for step in range(start_step, num_steps):
        batch = sharding_lib.put_global_batch(
            host_batch(data.batcher, step), mesh
        )
        state, metrics = train_step(state, batch, step_rng)
        pending.append((step, metrics))
        done = step + 1
        if done % config.train.log_every == 0 or done == num_steps:
          _log_steps(
              pending, meter, writer, schedule, log_path, num_steps, ckpt
          )
          pending = []
        if (
            config.train.eval_every
            and done % config.train.eval_every == 0
            and done < num_steps
        ):
          run_eval(done, config.train.eval_max_windows, "periodic_")
        if done % config.train.checkpoint_every == 0 or done == num_steps:
          ckpt.save(
              done,
              state,
              {
                  "step": done,
                  "batching": config.data.batching,
                  "seed": config.seed,
              },
          )
        for hook in hooks:
          hook(done, state)
    except BaseException:
      # Let checkpoints already started finish writing before leaving.
      ckpt.close()
      writer.flush()
      raise
    train_tps = meter.overall_tokens_per_s(num_steps)
    ckpt.wait()

  # ---------------------------------------------------------------- final eval
  final_step = int(jax.device_get(state.step))
  results = {
      "name": config.name,
      "step": final_step,
      "unit": unit,
      "num_params": n_params,
  }
  results.update(run_eval(final_step, int(config.eval.max_windows), ""))
  if train_tps is not None:
    results["train_tokens_per_s"] = train_tps
  for split, stream in data.splits.items():
    results.setdefault("unigram", {})[split] = evaluate.unigram_baseline(
        data.train.tokens, stream.tokens, data.vocab_size, unit
    )
  writer.flush()
  ckpt.close()
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "results.json"), "w") as f:
      json.dump(results, f, indent=2, sort_keys=True)
  return results


def evaluate_only(
    config: ml_collections.ConfigDict, workdir: str
) -> dict[str, Any]:
  """Evaluates the latest checkpoint of ``workdir`` (``--mode=eval``)."""
  return train_and_evaluate(config, workdir, mode="eval")


@dataclasses.dataclass
class Restored:
  """A model with the parameters of a run's latest checkpoint."""

  model: transformer.TransformerLM
  params: Any
  data: Data
  mesh: Mesh
  step: int
  unit: str


def restore_latest(
    config: ml_collections.ConfigDict, workdir: str, mode: str
) -> Restored:
  """Builds the model of ``config`` and restores the latest checkpoint.

  Args:
    config: the run's configuration.
    workdir: the run's directory (``<workdir>/checkpoints``).
    mode: the mode asking, for the error message.

  Raises:
    FileNotFoundError: the workdir has no checkpoint.
    checkpointing.CheckpointMismatchError: it holds another model.
  """
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    raise FileNotFoundError(
        f"--mode={mode} needs a trained run: no checkpoints in {ckpt_dir}"
    )
  mesh = sharding_lib.make_mesh(config.mesh.to_dict())
  data = load_data(config, workdir)
  model = build_model(config.model, data.vocab_size)
  ckpt = checkpointing.Checkpointer(
      ckpt_dir,
      keep=config.train.keep_checkpoints,
      signature=model_signature(config, data.vocab_size),
  )
  try:
    latest = ckpt.latest_step()
    if latest is None:
      raise FileNotFoundError(
          f"--mode={mode} needs a trained run: no checkpoint steps in {ckpt_dir}"
      )
    tx, _ = optim.make_optimizer(config.optim, int(config.train.num_steps))
    state, shardings = create_state(
        model,
        tx,
        mesh,
        host_batch(data.batcher, 0),
        jax.random.PRNGKey(config.seed),
    )
    abstract = checkpointing.abstract_with_sharding(state, shardings)
    state, _ = ckpt.restore(latest, abstract)
  finally:
    ckpt.close()
  console.info("restored %s step %d", ckpt_dir, latest)
  return Restored(
      model,
      state.params,
      data,
      mesh,
      int(latest),
      evaluate.metric_unit(data.corpus),
  )
