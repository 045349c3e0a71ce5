"""The training loop: set-up, resume, updates, evaluation, checkpoints.

``train_and_evaluate(run)`` trains the run ``memjax.build`` built, with
periodic evaluation and checkpoints, resumes automatically from
``<workdir>/checkpoints``, evaluates the final model on the evaluation
splits, and writes ``<workdir>/results.json`` next to the TensorBoard
events. Its parts (task, model, batcher, objective, optimiser, hooks) come
from the run; this module is the loop only.

Resuming is safe: the checkpoint's model signature (the whole model
section) and data position (``memjax.run.position``: batching, seed, batch
and segment sizes, corpus) must match the run, and the schedule horizon
(``train.num_steps``) is stored with the run: a resumed run with another
``num_steps`` stops with a message unless ``train.extend_schedule`` is set.
A damaged latest checkpoint is moved aside with a warning and the previous
one is used.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Optional

import jax
import numpy as np
import optax

from memjax import errors
from memjax import losses
from memjax import sharding as sharding_lib
from memjax.checkpoints import checkpointing
from memjax.checkpoints import runfiles
from memjax.data import corpus as corpus_lib
from memjax.io import console
from memjax.io import events
from memjax.io import paths
from memjax.models import variables as model_vars
from memjax.run import init_from
from memjax.run import ownership
from memjax.run import position as position_lib
from memjax.run import preemption
from memjax.run import profiling
from memjax.run import spec
from memjax.run import step as step_lib

TrainState = step_lib.TrainState
NonFiniteLossError = errors.NonFiniteLossError
Hook = Callable[[int, TrainState], None]


def _append_log(log_path: str, lines: list[str]) -> None:
  """Appends ``lines`` to ``train_log.jsonl`` (process 0 only)."""
  if lines and jax.process_index() == 0:
    paths.append_text(log_path, "".join(lines))


def cut_log(log_path: str, step: int) -> int:
  """Keeps the lines of ``train_log.jsonl`` up to ``step`` (process 0).

  A run resumed from the checkpoint of ``step`` runs the updates after it
  again, and logs them again: the lines the interrupted job wrote for them
  (and a line it left half written) are dropped first, so that the log
  holds each step once.

  Returns:
    The number of lines dropped.
  """
  if jax.process_index() > 0 or not paths.exists(log_path):
    return 0
  lines = paths.read_text(log_path).splitlines(keepends=True)
  kept = []
  for line in lines:
    try:
      row_step = int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
      continue  # Half a line: the job was killed while writing it.
    if row_step <= step and line.endswith("\n"):
      kept.append(line)
  dropped = len(lines) - len(kept)
  if dropped:
    paths.write_text(log_path, "".join(kept))
    console.info(
        "train_log.jsonl: %d lines after step %d dropped (logged again as "
        "the updates run again)",
        dropped,
        step,
    )
  return dropped


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
    aux = model_vars.means(m.get("stats", {}))
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


def position(
    run: spec.Run, step: int, hook_states: Optional[dict[str, Any]] = None
) -> dict[str, Any]:
  """The data position of ``run`` at ``step`` (``position.data_position``)."""
  return position_lib.data_position(
      run.settings, run.task.data_settings(), step, hook_states
  )


@dataclasses.dataclass
class Setup:
  """A run's parts, built and validated before the loop starts."""

  run: spec.Run
  corpus: Any
  batcher: Any
  model: Any
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


def _prepare(run: spec.Run) -> Setup:
  """Checks, reads and restores; nothing is written before the mesh and
  data files check out, and a failed set-up of a new workdir leaves no
  directory behind."""
  task, workdir, s = run.task, run.workdir, run.settings
  runfiles.check_init_from(s.train.init_from, workdir)
  task.check_batch_fits(run.mesh, run.carries_memory())
  task.check_data(train=True, workdir=workdir)
  position_lib.check_resume(position(run, 0), workdir)
  console.info(
      "mesh: %s over %d %s devices",
      dict(run.mesh.shape),
      run.mesh.size,
      jax.devices()[0].platform,
  )
  with corpus_lib.cleanup_on_error(workdir):
    corpus = task.load(workdir)
    console.info("%s", task.describe(corpus))
    batcher = run.batcher(corpus.train, corpus.cache_dir)
    model = run.model(corpus.vocab_size)
    tx, schedule = run.optimizer()
    loss_fn = run.objective()
    sample = run.host_batch(batcher, 0)
    state, shardings = step_lib.create_state(
        model,
        tx,
        run.mesh,
        sample,
        jax.random.PRNGKey(s.seed),
        run.state_collections(),
    )
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    console.info("model: %s parameters", f"{n_params:,}")
    ckpt = checkpointing.Checkpointer(
        paths.join(workdir, "checkpoints"),
        keep=s.train.keep_checkpoints,
        signature=run.signature(corpus.vocab_size),
    )
    # Inside the clean-up: a train.init_from that does not fit a new run
    # leaves no workdir behind.
    try:
      state, saved = _restore_or_init(run, ckpt, state, shardings)
    except BaseException:
      ckpt.close()
      raise
  return Setup(
      run,
      corpus,
      batcher,
      model,
      tx,
      schedule,
      loss_fn,
      state,
      shardings,
      ckpt,
      int(saved["step"]),
      n_params,
      dict(saved.get("hooks", {})),
  )


def _restore_or_init(run, ckpt, state, shardings) -> tuple[TrainState, dict]:
  """Resumes from the newest readable checkpoint, or takes ``init_from``;
  returns the state and its data position (``{'step': 0}`` when new)."""
  train = run.settings.train
  abstract = checkpointing.abstract_with_sharding(state, shardings)
  now = position(run, 0)
  restored = ckpt.restore_latest(
      abstract,
      check=lambda p: position_lib.check_position(
          now, p, ckpt.directory, train.extend_schedule
      ),
      restart_if_damaged=train.restart_if_damaged,
  )
  if restored is not None:
    state, saved, step = restored
    console.info("resumed from %s at step %d", ckpt.directory, step)
    return state, saved
  if train.init_from:
    state = init_from.init_params_from(run, train.init_from, state, shardings)
  return state, {"step": 0}


# ----------------------------------------------------------------------------
# Loop
# ----------------------------------------------------------------------------


def _train_step(s: Setup) -> Any:
  """The jitted update of ``s``'s model, optimiser and loss."""
  run = s.run
  return step_lib.make_train_step(
      s.model,
      s.tx,
      s.loss_fn,
      grad_accum=run.settings.train.grad_accum,
      state_shardings=s.shardings,
      mesh=run.mesh,
      segments_per_lane=int(run.settings.data.segments_per_lane),
      extra_inputs=run.extra_inputs,
  )


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
  run = s.run
  train = run.settings.train
  num_steps = int(train.num_steps)
  if s.start_step >= num_steps:
    return None
  tokens_per_step = run.task.tokens_per_step()
  train_step = _train_step(s)
  evaluator = run.task.evaluator(run, s.model, s.corpus)
  meter = console.ProgressMeter(num_steps, tokens_per_step, s.start_step)
  step_rng = jax.random.PRNGKey(run.settings.seed + 1)
  pending: list[tuple[int, dict]] = []
  console.info(
      "training from step %d to %d (%d tokens per step)",
      s.start_step,
      num_steps,
      tokens_per_step,
  )
  log_path = paths.join(run.workdir, "train_log.jsonl")
  cut_log(log_path, s.start_step)
  step_hooks = run.hooks(
      s.hook_states,
      model=s.model,
      mesh=run.mesh,
      corpus=s.corpus,
      batcher=s.batcher,
      writer=writer,
  )
  step_hooks.start()
  state = s.state
  for step in range(s.start_step, num_steps):
    batch = sharding_lib.put_global_batch(
        run.host_batch(s.batcher, step), run.mesh
    )
    state, metrics = trace.run(step + 1, train_step, state, batch, step_rng)
    pending.append((step, metrics))
    done = step + 1
    stopping = stop.should_stop(done)
    last = stopping or done == num_steps  # This run's last update.
    logs = last or done % train.log_every == 0
    saves = last or done % train.checkpoint_every == 0
    if logs or saves:  # Written only while this job holds the workdir.
      ownership.check_held(run.workdir, done)
    if logs:
      _log_steps(
          pending, meter, writer, s.schedule, log_path, num_steps, s.ckpt
      )
      pending = []
    if train.eval_every and done % train.eval_every == 0 and not last:
      evaluator.run(
          state.variables, done, train.eval_max_windows, "periodic_", writer
      )
    step_hooks.run(done, state.variables)
    if saves:
      s.ckpt.save(done, state, position(run, done, step_hooks.states()))
    for hook in hooks:
      hook(done, state)
    if stopping:
      raise stop.stopped(done, s.ckpt)
  s.state = state
  s.ckpt.wait()
  return meter.overall_tokens_per_s(num_steps)


def train_and_evaluate(
    run: spec.Run, hooks: tuple[Hook, ...] = ()
) -> dict[str, Any]:
  """Trains, then evaluates the final model on ``eval.splits``.

  Args:
    run: the run (``memjax.build.build``).
    hooks: callables ``hook(step, state)`` run after each update and its
      checkpoint (profilers, custom logging, tests that interrupt a run).
      The step hooks of ``train.hooks`` (``memjax.run.hooks``) run before
      the checkpoint, and their state is saved with it.

  Returns:
    The results written to ``results.json``.
  """
  s = _prepare(run)
  workdir = run.workdir
  writer = None
  try:
    if jax.process_index() == 0:
      runfiles.write_run_files(
          workdir, run.config_json, run.task.vocabulary(workdir)
      )
    writer = events.EventWriter(workdir, just_logging=jax.process_index() > 0)
    with (
        preemption.StopSignal() as stop,
        profiling.StepTrace(run.settings.train, workdir) as trace,
    ):
      train_tps = _train(s, writer, hooks, stop, trace)
    results = run.task.final_results(
        run,
        s.model,
        s.state.variables,
        s.corpus,
        int(jax.device_get(s.state.step)),
        writer,
    )
  finally:
    # Let checkpoints already started finish writing before leaving.
    s.ckpt.close()
    if writer is not None:
      writer.close()
  results["num_params"] = s.num_params
  if train_tps is not None:
    results["train_tokens_per_s"] = train_tps
  if jax.process_index() == 0:
    paths.write_json(paths.join(workdir, "results.json"), results)
  return results
