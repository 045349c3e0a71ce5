"""The training loop: mesh, data, model, state, step, checkpoints, loop.

``train_and_evaluate(config, workdir)`` trains with periodic evaluation and
checkpoints, resumes automatically from ``<workdir>/checkpoints``, evaluates
the final model on the evaluation splits, and writes
``<workdir>/results.json`` next to the TensorBoard events. Everything it
trains is built by ``memjax.experiment``; this module is the loop only.

Resuming is safe: the checkpoint's model signature (the whole model config)
and data position (batching, seed, batch and segment sizes, corpus) must
match the config, and the schedule horizon (``train.num_steps``) is stored
with the run: a resumed run with another ``num_steps`` stops with a message
unless ``train.extend_schedule`` is set. A damaged latest checkpoint is moved
aside with a warning and the previous one is used.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Optional

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from memjax.checkpoints import checkpointing
from memjax.io import console
from memjax import errors
from memjax import experiment
from memjax.run import hooks as hooks_lib
from memjax import losses
from memjax.run import optim
from memjax.run import preemption
from memjax.run import profiling
from memjax.io import paths
from memjax.checkpoints import runfiles
from memjax import sharding as sharding_lib
from memjax.models import stats
from memjax.io import events
from memjax.tasks import base as task_lib
from memjax.run import step as train_step_lib
from memjax.models import transformer

Array = jax.Array
TrainState = experiment.TrainState
NonFiniteLossError = errors.NonFiniteLossError
Hook = Callable[[int, TrainState], None]

# ----------------------------------------------------------------------------
# Loop
# ----------------------------------------------------------------------------


def _append_log(log_path: str, lines: list[str]) -> None:
  """Appends ``lines`` to ``train_log.jsonl`` (process 0 only)."""
  if lines and jax.process_index() == 0:
    paths.append_text(log_path, "".join(lines))


def _log_steps(
    pending: list[tuple[int, dict]],
    meter: console.ProgressMeter,
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
  # Every process checks the metrics; process 0 writes them.
  lines = []
  for (s, _), m in zip(pending, fetched):
    if not m["finite"]:
      _append_log(log_path, lines)
      ckpt.close()
      raise NonFiniteLossError(
          f"non-finite loss or gradient at step {s + 1} (loss "
          f"{float(m['loss'])}, grad norm {float(m['grad_norm'])}); the "
          f"update was skipped and the checkpoints in {ckpt.directory} are "
          "intact: lower optim.learning_rate or set optim.clip_norm"
      )
    record = {
        "step": s + 1,
        "loss": float(m["loss"]),
        "grad_norm": float(m["grad_norm"]),
    }
    aux = stats.means(m.get("stats", {}))
    if aux:
      record["aux"] = aux
    lines.append(json.dumps(record) + "\n")
  _append_log(log_path, lines)
  done = pending[-1][0] + 1
  speed = meter.update(done)
  # Every scalar is a mean over the steps since the last log.
  scalars = losses.interval_scalars(fetched)
  mean_loss = scalars["train/loss"]
  scalars["train/lr"] = float(schedule(done - 1))
  scalars["train/tokens_per_s"] = speed["tokens_per_s"]
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


# ----------------------------------------------------------------------------
# Set-up and resume
# ----------------------------------------------------------------------------

# Data settings a checkpoint's position depends on.
_POSITION_KEYS = (
    "corpus",
    "batching",
    "seed",
    "batch_size",
    "seq_len",
    "segments_per_lane",
)


def data_position(
    config: ml_collections.ConfigDict,
    step: int,
    hook_states: Optional[dict[str, Any]] = None,
) -> dict:
  """What is saved with a checkpoint: the step, the settings that make the
  batches of every step, the schedule horizon, what shapes the optimiser
  state, and the step hooks' states."""
  d = config.data
  position = {
      "step": int(step),
      "corpus": d.corpus,
      "batching": d.batching,
      "seed": int(config.seed),
      "batch_size": int(d.batch_size),
      "seq_len": int(d.seq_len),
      "segments_per_lane": int(d.segments_per_lane),
      "schedule_steps": int(config.train.num_steps),
      "optim_layout": optim.layout(config.optim),
  }
  task_settings = task_lib.get(config).data_settings(config)
  if task_settings:
    position["task_data"] = task_settings
  if hook_states is not None:
    position["hooks"] = hook_states
  return position


def check_data_settings(
    config: ml_collections.ConfigDict, saved: dict, where: str
) -> None:
  """Raises ResumeError if resuming ``saved`` with ``config`` would change
  the batches (the data settings and the task's ``data_settings``)."""
  now = data_position(config, 0)
  diffs = [
      f"{'seed' if k == 'seed' else 'data.' + k}: {saved[k]!r} -> {now[k]!r}"
      for k in _POSITION_KEYS
      if k in saved and saved[k] != now[k]
  ]
  saved_task = saved.get("task_data", {})
  diffs += [
      f"{k}: {saved_task[k]!r} -> {v!r}"
      for k, v in now.get("task_data", {}).items()
      if k in saved_task and saved_task[k] != v
  ]
  if diffs:
    raise errors.ResumeError(
        f"{where} was trained with other data settings ({'; '.join(diffs)}): "
        "its saved position would point at other batches; resume with the "
        "run's settings, or start a new --workdir with "
        "--config.train.init_from=<this run>"
    )


def check_position(
    config: ml_collections.ConfigDict, saved: dict, where: str
) -> None:
  """Raises ResumeError if resuming ``saved`` with ``config`` would change
  the batches, not fit the optimiser state or silently re-stretch the
  schedule."""
  check_data_settings(config, saved, where)
  now = data_position(config, 0)
  layout = saved.get("optim_layout")
  if layout is not None and layout != now["optim_layout"]:
    raise errors.ResumeError(
        f"{where} was trained with another optimiser layout ({layout} -> "
        f"{now['optim_layout']}: optim.optimizer, optim.transform or "
        "optim.groups): its optimiser state would not fit; resume with the "
        "run's optim settings, or start a new --workdir with "
        "--config.train.init_from=<this run>"
    )
  horizon = saved.get("schedule_steps")
  if horizon is None or horizon == now["schedule_steps"]:
    return
  if not config.train.extend_schedule:
    raise errors.ResumeError(
        f"{where} was trained with a {horizon}-step schedule (learning rate"
        f" and TRIME warm-up); train.num_steps={now['schedule_steps']} would"
        " re-stretch it. To continue this run, add"
        " --config.train.extend_schedule=True (the schedule is rebuilt over"
        " the new num_steps from the saved step on); or start a new --workdir"
        " with --config.train.init_from=<this run>"
    )


def check_resume(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Checks the newest checkpoint's data settings (``check_data_settings``)
  before the data is read, so a resume with other settings stops before
  anything (a vocabulary, encoded data) is written into ``workdir``. The
  model, optimiser layout and schedule are checked when the checkpoint is
  restored (they need the model); a position that cannot be read is left
  to the restore, which sets a damaged step aside."""
  directory = paths.join(workdir, "checkpoints")
  if not paths.isdir(directory):
    return
  ckpt = checkpointing.Checkpointer(
      directory, keep=1, signature={}, create=False
  )
  try:
    step = ckpt.latest_step()
    if step is None:
      return
    try:
      saved = ckpt.read_data(step)
    except Exception:  # pylint: disable=broad-except
      return
    check_data_settings(config, saved, ckpt.directory)
  finally:
    ckpt.close()


def check_workdir(workdir: str) -> None:
  """Refuses, before anything is written, a workdir whose filesystem cannot
  be opened or that holds something other than a run (an export, a
  datastore, a token cache, files of no run)."""
  paths.check_workdir(workdir)
  runfiles.check_workdir(workdir, training=True)


@dataclasses.dataclass
class Setup:
  """A run's parts, built and validated before the loop starts."""

  config: ml_collections.ConfigDict
  workdir: str
  mesh: Mesh
  corpus: experiment.Corpus
  batcher: Any
  model: transformer.TransformerLM
  tx: optax.GradientTransformation
  schedule: Callable
  loss_fn: Callable
  state: TrainState
  shardings: Any
  ckpt: checkpointing.Checkpointer
  start_step: int
  num_params: int
  # {name: state} of the step hooks, from the checkpoint resumed.
  hook_states: dict[str, Any] = dataclasses.field(default_factory=dict)


def _prepare(config: ml_collections.ConfigDict, workdir: str) -> Setup:
  """Validates, builds and restores; nothing is written before the config,
  mesh and data files check out, and a failed set-up of a new workdir
  leaves no directory behind."""
  check_workdir(workdir)
  experiment.validate_config(config)
  hooks_lib.check_config(config)
  mesh = experiment.make_mesh(config)
  task = task_lib.get(config)
  task.check_batch_fits(config, mesh)
  task.check_data(config, train=True)
  check_resume(config, workdir)
  console.info(
      "mesh: %s over %d %s devices",
      dict(mesh.shape),
      mesh.size,
      jax.devices()[0].platform,
  )
  with experiment.cleanup_on_error(workdir):
    corpus = task.load(config, workdir)
    console.info("%s", task.describe(corpus))
    batcher = experiment.make_batcher(config, corpus.train, corpus.cache_dir)
    model = experiment.build_model(config.model, corpus.vocab_size)
    num_steps = int(config.train.num_steps)
    tx, schedule = experiment.make_optimizer(config, num_steps)
    loss_fn = losses.make_loss(config.loss, num_steps, seed=config.seed)
    sample = experiment.host_batch(batcher, 0)
    state, shardings = experiment.create_state(
        model, tx, mesh, sample, jax.random.PRNGKey(config.seed)
    )
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    console.info("model: %s parameters", f"{n_params:,}")
    signature = experiment.model_signature(config, corpus.vocab_size)
    ckpt_dir = paths.join(workdir, "checkpoints")
    ckpt = checkpointing.Checkpointer(
        ckpt_dir, keep=config.train.keep_checkpoints, signature=signature
    )
    # Inside the clean-up: a train.init_from that does not fit a new run
    # leaves no workdir behind.
    try:
      state, position = _restore_or_init(config, ckpt, state, shardings)
    except BaseException:
      ckpt.close()
      raise
  return Setup(
      config, workdir, mesh, corpus, batcher, model, tx, schedule, loss_fn,
      state, shardings, ckpt, int(position["step"]), n_params,
      dict(position.get("hooks", {})),
  )  # fmt: skip


def _restore_or_init(config, ckpt, state, shardings) -> tuple[TrainState, dict]:
  """Resumes from the newest readable checkpoint, or takes ``init_from``;
  returns the state and its data position (``{'step': 0}`` when new)."""
  abstract = checkpointing.abstract_with_sharding(state, shardings)
  restored = ckpt.restore_latest(
      abstract,
      check=lambda p: check_position(config, p, ckpt.directory),
      restart_if_damaged=config.train.get("restart_if_damaged", False),
  )
  if restored is not None:
    state, position, step = restored
    console.info("resumed from %s at step %d", ckpt.directory, step)
    return state, position
  if config.train.init_from:
    state = experiment.init_params_from(
        config.train.init_from, state, shardings, config
    )
  return state, {"step": 0}


# ----------------------------------------------------------------------------
# Loop
# ----------------------------------------------------------------------------


def _train(
    s: Setup,
    writer: Any,
    hooks: tuple[Hook, ...],
    stop: preemption.StopSignal,
    trace: profiling.StepTrace,
) -> Optional[float]:
  """Runs the updates from ``s.start_step``; returns the tokens/s.

  Raises:
    preemption.Preempted: ``stop`` caught a signal; the checkpoint of the
      last update is written.
  """
  config = s.config
  num_steps = int(config.train.num_steps)
  if s.start_step >= num_steps:
    return None
  task = task_lib.get(config)
  tokens_per_step = task.tokens_per_step(config)
  train_step = train_step_lib.make_train_step(
      s.model,
      s.tx,
      s.loss_fn,
      grad_accum=config.train.grad_accum,
      state_shardings=s.shardings,
      mesh=s.mesh,
      segments_per_lane=int(config.data.segments_per_lane),
  )
  evaluator = task.evaluator(config, s.model, s.mesh, s.corpus)
  meter = console.ProgressMeter(num_steps, tokens_per_step, s.start_step)
  step_rng = jax.random.PRNGKey(config.seed + 1)
  pending: list[tuple[int, dict]] = []
  console.info(
      "training from step %d to %d (%d tokens per step)",
      s.start_step,
      num_steps,
      tokens_per_step,
  )
  log_path = paths.join(s.workdir, "train_log.jsonl")
  step_hooks = hooks_lib.HookRunner(
      config, s.hook_states, workdir=s.workdir, model=s.model, mesh=s.mesh,
      corpus=s.corpus, batcher=s.batcher, writer=writer,
  )  # fmt: skip
  step_hooks.start()
  state = s.state
  for step in range(s.start_step, num_steps):
    batch = sharding_lib.put_global_batch(
        experiment.host_batch(s.batcher, step), s.mesh
    )
    state, metrics = trace.run(step + 1, train_step, state, batch, step_rng)
    pending.append((step, metrics))
    done = step + 1
    stopping = stop.should_stop(done)
    last = stopping or done == num_steps  # This run's last update.
    if last or done % config.train.log_every == 0:
      _log_steps(
          pending, meter, writer, s.schedule, log_path, num_steps, s.ckpt
      )
      pending = []
    if (
        config.train.eval_every
        and done % config.train.eval_every == 0
        and not last
    ):
      evaluator.run(
          state.variables, done, config.train.eval_max_windows, "periodic_",
          writer,
      )  # fmt: skip
    step_hooks.run(done, state.variables)
    if last or done % config.train.checkpoint_every == 0:
      position = data_position(config, done, step_hooks.states())
      s.ckpt.save(done, state, position)
    for hook in hooks:
      hook(done, state)
    if stopping:
      raise stop.stopped(done, s.ckpt)
  s.state = state
  s.ckpt.wait()
  return meter.overall_tokens_per_s(num_steps)


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    hooks: tuple[Hook, ...] = (),
) -> dict[str, Any]:
  """Trains, then evaluates the final model on ``eval.splits``.

  Args:
    config: the experiment configuration.
    workdir: output directory (checkpoints, TensorBoard events,
      ``config.json``, vocabulary, ``train_log.jsonl``, ``results.json``).
    hooks: callables ``hook(step, state)`` run after each update and its
      checkpoint (profilers, custom logging, tests that interrupt a run).
      The step hooks of ``config.train.hooks`` (``memjax.run.hooks``) run
      before the checkpoint, and their state is saved with it.

  Returns:
    The results written to ``results.json``.
  """
  s = _prepare(config, workdir)
  task = task_lib.get(config)
  writer = None
  try:
    if jax.process_index() == 0:
      runfiles.write_run_files(
          workdir, config, task.vocabulary(config, workdir)
      )
    writer = events.EventWriter(workdir, just_logging=jax.process_index() > 0)
    with (
        preemption.StopSignal() as stop,
        profiling.StepTrace(config, workdir) as trace,
    ):
      train_tps = _train(s, writer, hooks, stop, trace)
    results = task.final_results(
        config, s.model, s.state.variables, s.mesh, s.corpus,
        int(jax.device_get(s.state.step)), writer,
    )  # fmt: skip
  finally:
    # Let checkpoints already started finish writing before leaving.
    s.ckpt.close()
    if writer is not None:
      writer.close()
  results["num_params"] = s.num_params
  if train_tps is not None:
    results["train_tokens_per_s"] = train_tps
  if jax.process_index() == 0:
    runfiles.write_json(paths.join(workdir, "results.json"), results)
  return results
