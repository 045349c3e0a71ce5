"""What the benchmark scripts share: configs, machine, train steps, timing.

* ``load_config`` / ``apply_overrides``: config files and ``KEY=VALUE``
  overrides through ml_collections' own loader and field parsers, as
  ``--config.KEY=VALUE`` on ``memjax.main`` (``model.remat=False`` is False;
  an unknown key is a ``ConfigError`` naming it).
* ``machine``: platform, CPU, devices, versions, load; never the host name.
* ``TrainBench``: one config's model, state, compiled train step and
  batches, built as the training loop builds them; TRIME configs are timed
  with the plain-LM warm-up off (``trime.lm_warmup_fraction = 0``).
* ``run_rounds``, ``summarize``, ``ratios``, ``finish``: the configs
  alternate within rounds, the median round is reported, with ratios
  against the first (baseline) config, as JSON with the machine.

The parts come from the run ``memjax.build.build`` makes of a config
(``_build``), as the training loop gets them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from absl import flags
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np

from memjax import sharding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STATISTIC_NOTE = "median round; the configs alternate within each round"
LM_WARMUP_NOTE = (
    "off: TRIME configs are timed with trime.lm_warmup_fraction = 0, so every "
    "timed step computes the TRIME loss (see each result's timing_changes)"
)


def _build(
    cfg: ml_collections.ConfigDict,
    workdir: str = "",
    mesh: Mapping[str, int] | None = None,
) -> Any:
  """The run ``memjax.build.build`` makes of ``cfg``: its model, batcher,
  objective and optimiser (on ``mesh``'s axis sizes instead of the
  config's when given, e.g. {'data': 1}: the first device only).

  Imported on first use: the whole package loads, which the config parsing
  and the statistics here do not need.
  """
  from memjax import build  # pylint: disable=g-import-not-at-top

  return build.build(cfg, workdir, mesh=mesh)


# Configs.


class ConfigError(ValueError):
  """A config file that does not load or an override that does not apply."""


def load_config(
    spec: str, overrides: Iterable[str] = ()
) -> ml_collections.ConfigDict:
  """Loads ``'path.py[:variant]'`` and applies ``KEY=VALUE`` overrides.

  A relative path is looked up in the working directory, then in the
  repository. The config is locked: overrides and later assignments can
  change values but not add keys.

  Raises:
    ConfigError: a missing file, a variant ``get_config`` rejects, or a bad
      override (see apply_overrides).
  """
  path, colon, variant = spec.partition(":")
  if not os.path.isfile(path) and os.path.isfile(os.path.join(REPO, path)):
    path = os.path.join(REPO, path)
  if not os.path.isfile(path):
    raise ConfigError(f"no config file {path!r} (from {spec!r})")
  argv = ["load_config", f"--config={path}{colon}{variant}"]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file(
      "config", flag_values=flag_values, lock_config=True, sys_argv=argv
  )
  try:
    flag_values(argv)
  except flags.Error as e:  # The last line of the wrapped traceback.
    reason = str(e).strip().splitlines()[-1]
    raise ConfigError(f"{spec!r} does not load: {reason}") from e
  cfg = flag_values.config
  if not isinstance(cfg, ml_collections.ConfigDict):
    raise ConfigError(f"{spec!r} did not give a ConfigDict")
  return apply_overrides(cfg, overrides)


def _check_key(cfg: ml_collections.ConfigDict, key: str, item: str) -> None:
  """Raises ConfigError unless the dotted ``key`` names a field of ``cfg``."""
  node = cfg
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise ConfigError(f"unknown config key {key!r} in override {item!r}")
    node = node[part]


def apply_overrides(
    cfg: ml_collections.ConfigDict, overrides: Iterable[str]
) -> ml_collections.ConfigDict:
  """Applies ``KEY=VALUE`` overrides to ``cfg`` (locking it) and returns it.

  KEY is a dotted path (``model.remat``); VALUE is parsed by ml_collections'
  parser for the field's type, as ``--config.KEY=VALUE``: bool (True, false,
  1, ...), int, float, tuple (``(1, 2)``, ``()``), str, dict literal.

  Raises:
    ConfigError: naming the key, for a string without '=', an unknown key,
      or a value the field's parser rejects.
  """
  items = list(overrides)
  for item in items:
    key, eq, _ = item.partition("=")
    if not eq or not key:
      raise ConfigError(f"override {item!r} is not KEY=VALUE")
    _check_key(cfg, key, item)
  if not items:
    return cfg
  argv = ["overrides"] + [f"--config.{item}" for item in items]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_dict(
      "config", cfg, flag_values=flag_values, sys_argv=argv
  )
  try:
    flag_values(argv)
  except flags.Error as e:
    raise ConfigError(str(e)) from e
  return cfg


def disable_lm_warmup(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
  """Turns a TRIME config's plain-LM warm-up off; returns what changed."""
  if cfg.loss.name != "trime" or not cfg.trime.lm_warmup_fraction:
    return {}
  old = cfg.trime.lm_warmup_fraction
  cfg.trime.lm_warmup_fraction = 0.0
  return {"trime.lm_warmup_fraction": {"config": old, "timed": 0.0}}


# Machine.


def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo), else what platform reports."""
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  return platform.processor() or platform.machine()


def machine(devices: bool = True) -> dict[str, Any]:
  """The machine a benchmark ran on, without its host name.

  Args:
    devices: also ask JAX for its devices (starts the backend); False for
      benchmarks that run no JAX program.
  """
  out = {
      "os": platform.system(),
      "arch": platform.machine(),
      "cpu": cpu_model(),
      "cpu_count": os.cpu_count(),
      "python": platform.python_version(),
      "numpy": np.__version__,
      "jax": jax.__version__,
  }
  if hasattr(os, "getloadavg"):
    out["load_average_1_5_15_min"] = [round(x, 2) for x in os.getloadavg()]
  if devices:
    dev = jax.devices()[0]
    out.update(
        platform=dev.platform,
        device_kind=dev.device_kind,
        device_count=jax.device_count(),
        process_count=jax.process_count(),
    )
  return out


def device_peak_bytes() -> int | None:
  """The device's peak bytes in use so far (GPU, TPU), None where unknown."""
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"])
  return None


def process_peak_rss_bytes() -> int:
  """Peak resident set of this process so far (Linux reports KiB)."""
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(rss if sys.platform == "darwin" else rss * 1024)


# Data and train steps.


def load_corpus(
    cfg: ml_collections.ConfigDict, workdir: str
) -> tuple[Any, int]:
  """The training batcher of ``cfg``'s corpus and its vocabulary size."""
  from memjax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top

  run = _build(cfg, workdir)
  s = run.settings
  corpus = corpus_lib.load_corpus(s.data, s.eval, workdir, (), train=True)
  return run.batcher(corpus.train, corpus.cache_dir), corpus.vocab_size


def make_batcher(
    cfg: ml_collections.ConfigDict, stream: Any, cache_dir: str
) -> Any:
  """The batcher of ``cfg.data.batching`` over a token stream."""
  return _build(cfg, cache_dir).batcher(stream, cache_dir)


def host_batches(batcher: Any, count: int) -> list[dict[str, np.ndarray]]:
  """The first ``count`` global batches, as the train step consumes them."""
  from memjax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top

  return [corpus_lib.host_batch(batcher, i) for i in range(count)]


class TrainBench:
  """One config's model, train state, compiled train step and batches.

  Built as the training loop builds them, with the TRIME warm-up off
  (``disable_lm_warmup``). Steps cycle through the batches; the state is
  donated and carried, memory included.

  Attributes (besides model, mesh, state, step, batches, rng):
    name: the label in reports.
    timing_changes: what ``disable_lm_warmup`` changed in ``cfg``.
    step_memory_bytes: XLA's memory estimate of one step (arguments +
      outputs + temporaries - donated aliases).
    mesh_sizes: the mesh axis sizes it was built on (None: the config's
      mesh over every device; {'data': 1}: the first device only).
    setup_s, warmup_s: seconds to build (one compilation) and to warm up.
    times: seconds per step, one per round.
    last_metrics: the last step's metrics, on the host.
  """

  def __init__(
      self,
      name: str,
      cfg: ml_collections.ConfigDict,
      vocab_size: int,
      batches: Sequence[Mapping[str, np.ndarray]],
      mesh: Mapping[str, int] | None = None,
  ):
    # pylint: disable=g-import-not-at-top
    from memjax.run import step as step_lib

    t0 = time.time()
    self.name = name
    self.timing_changes = disable_lm_warmup(cfg)
    self.cfg = cfg
    self.mesh_sizes = mesh
    run = _build(cfg, mesh=mesh)
    self.mesh = run.mesh
    self.model = run.model(vocab_size)
    tx, _ = run.optimizer()
    loss_fn = run.objective()
    self.state, shardings = step_lib.create_state(
        self.model,
        tx,
        self.mesh,
        batches[0],
        jax.random.PRNGKey(cfg.seed),
        run.state_collections(),
    )
    self.step = step_lib.make_train_step(
        self.model,
        tx,
        loss_fn,
        grad_accum=cfg.train.grad_accum,
        state_shardings=shardings,
        mesh=self.mesh,
        segments_per_lane=int(cfg.data.segments_per_lane),
        extra_inputs=run.extra_inputs,
    )
    self.batches = [sharding.put_global_batch(b, self.mesh) for b in batches]
    self.rng = jax.random.PRNGKey(cfg.seed + 1)
    self.num_params = int(
        sum(np.prod(x.shape) for x in jax.tree.leaves(self.state.params))
    )
    self.step_memory_bytes = self.step.memory_bytes(
        self.state, self.batches[0], self.rng
    )
    self.setup_s = time.time() - t0
    self.warmup_s = 0.0
    self.times: list[float] = []
    self.last_metrics: dict[str, Any] | None = None

  @property
  def tokens_per_step(self) -> int:
    return int(self.cfg.data.batch_size * self.cfg.data.seq_len)

  def run(self, steps: int) -> float:
    """Runs ``steps`` updates; returns the seconds per step."""
    t0 = time.time()
    metrics = None
    for i in range(steps):
      batch = self.batches[i % len(self.batches)]
      self.state, metrics = self.step(self.state, batch, self.rng)
    jax.block_until_ready((self.state, metrics))
    seconds = (time.time() - t0) / max(steps, 1)
    if metrics is not None:
      self.last_metrics = jax.device_get(metrics)
    return seconds

  def warm_up(self, steps: int) -> None:
    """Untimed steps (the first call compiles)."""
    self.warmup_s = self.run(steps) * steps

  def compile(self, fn: Callable[..., Any] | None = None, *args: Any) -> Any:
    """``jax.jit(fn)`` compiled for ``args`` under the mesh's rules.

    Without ``fn``: the train step, for the state and the first batch.
    """
    with sharding.mesh_rules(self.mesh):
      if fn is None:
        step = self.step.jitted
        return step.lower(self.state, self.batches[0], self.rng).compile()
      return jax.jit(fn).lower(*args).compile()

  def result(self) -> dict[str, Any]:
    """Name, config, timing summary, memory, and the last loss."""
    out = {
        "name": self.name,
        "config": self.cfg.name,
        "tokens_per_step": self.tokens_per_step,
        **summarize(self.times, self.tokens_per_step),
        "setup_s": self.setup_s,
        "warmup_s": self.warmup_s,
        "num_params": self.num_params,
        "step_memory_bytes": self.step_memory_bytes,
        "timing_changes": self.timing_changes,
    }
    if self.last_metrics is not None:
      out["loss"] = float(self.last_metrics["loss"])
    return out


# Timing and reports.


def log(line: str) -> None:
  """Prints a progress line to stderr (stdout is for the JSON report)."""
  print(line, file=sys.stderr, flush=True)


def run_rounds(
    benches: Sequence[TrainBench],
    *,
    rounds: int,
    steps: int,
    warmup: int,
    progress: Callable[[str], None] = log,
) -> None:
  """Warms each bench up, then times ``steps`` steps of each per round.

  A bench is anything with ``name``, ``times``, ``warm_up(steps)`` and
  ``run(steps) -> seconds per step``. Within a round the benches run one
  after another, so a change in machine load hits all of them alike.
  Nothing runs when ``steps`` or ``rounds`` is 0.

  Raises:
    ValueError: ``warmup`` < 1 with timing on (the first step compiles).
  """
  if steps <= 0 or rounds <= 0:
    return
  if warmup < 1:
    raise ValueError(f"warmup must be >= 1 (the first step compiles): {warmup}")
  for bench in benches:
    start = time.perf_counter()
    bench.warm_up(warmup)
    progress(f"warm-up of {bench.name}: {time.perf_counter() - start:.1f} s")
  for r in range(rounds):
    for bench in benches:
      bench.times.append(bench.run(steps))
    progress(
        f"round {r + 1}/{rounds}: "
        + ", ".join(f"{b.name} {b.times[-1]:.4g} s/step" for b in benches)
    )


def summarize(times: Sequence[float], tokens_per_step: int) -> dict[str, Any]:
  """The median round's seconds per step and tokens/s; {} without rounds."""
  if not times:
    return {}
  median = float(statistics.median(times))
  return {
      "seconds_per_step_median": median,
      "seconds_per_step_all_rounds": [float(t) for t in times],
      "tokens_per_s": tokens_per_step / median,
  }


def ratios(
    results: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> list[dict[str, float | None]]:
  """Each result's ``keys`` over the first (baseline) result's.

  None where a value is missing or the baseline's is 0.
  """
  base = results[0] if results else {}
  return [
      {
          k: (r[k] / base[k] if r.get(k) is not None and base.get(k) else None)
          for k in keys
      }
      for r in results
  ]


WARMUP_HELP = "untimed steps per config before the rounds (the first compiles)"
ROUNDS_HELP = "rounds; the configs alternate within each, the median is kept"
SET_HELP = (
    "config override for every config, parsed like --config.KEY=VALUE of "
    "memjax.main (model.remat=False is False)"
)


def _at_least(minimum: int) -> Callable[[str], int]:
  """An argparse type: an int no smaller than ``minimum``."""

  def parse(text: str) -> int:
    value = int(text)
    if value < minimum:
      raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value

  return parse


def add_timing_args(
    parser: argparse.ArgumentParser,
    *,
    steps: int,
    warmup: int,
    rounds: int,
    steps_help: str = "timed steps per config and round",
) -> None:
  """Adds --steps, --warmup, --rounds, --set and --out."""
  add = parser.add_argument
  add("--steps", type=_at_least(0), default=steps, help=steps_help)
  add("--warmup", type=_at_least(1), default=warmup, help=WARMUP_HELP)
  add("--rounds", type=_at_least(1), default=rounds, help=ROUNDS_HELP)
  add("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
  add("--out", default="", help="also write the JSON report to this file")


def format_table(
    results: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> str:
  """One line per result: ``keys`` with their ratio to the first result."""
  if not results:
    return "no results"
  table = [["name", *keys]]
  for r, row in zip(results, ratios(results, keys)):
    line = [str(r["name"])]
    for k in keys:
      text = "-" if r.get(k) is None else f"{r[k]:.4g}"
      line.append(text if row[k] is None else f"{text} ({row[k]:.3f}x)")
    table.append(line)
  widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
  lines = [f"ratios against the baseline, {results[0]['name']}:"]
  for line in table:
    cells = [line[0].ljust(widths[0])]
    cells += [c.rjust(w) for c, w in zip(line[1:], widths[1:])]
    lines.append("  ".join(cells))
  return "\n".join(lines)


def finish(
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    *,
    ratio_keys: Sequence[str],
    **extra: Any,
) -> dict[str, Any]:
  """Adds ratios, prints the JSON report (stdout) and the table (stderr).

  Each result gets ``vs_baseline``: its ``ratio_keys`` over the first
  result's. The report holds the machine, the timing protocol, the
  overrides, ``extra``, the results, and the process's device and host
  memory peaks (cumulative over the whole run, so not per config). It is
  also written to ``args.out`` when set.
  """
  for r, row in zip(results, ratios(results, ratio_keys)):
    r["vs_baseline"] = row
  report = {
      "machine": machine(),
      "timing": {
          "rounds": args.rounds,
          "steps_per_round": args.steps,
          "warmup_steps": args.warmup,
          "statistic": STATISTIC_NOTE,
          "trime_lm_warmup": LM_WARMUP_NOTE,
      },
      "overrides": list(args.set),
      **extra,
      "baseline": results[0]["name"] if results else None,
      "results": results,
      "device_peak_bytes_in_process": device_peak_bytes(),
      "process_peak_rss_bytes": process_peak_rss_bytes(),
  }
  text = json.dumps(report, indent=2)
  print(text)
  log(format_table(results, ratio_keys))
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")
  return report
