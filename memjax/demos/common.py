"""What the demos share: flags, rows, runs, config files and the table.

A demo defines ``--workdir``, ``--steps`` and ``--rows`` with
``define_flags``, declares its rows (``Row``: the key ``--rows`` selects,
the label in the table, the config file and variant it trains), picks the
selected ones with ``select`` and runs them in a ``Demo``:

* ``Demo.config`` loads ``<configs_dir()>/<name>.py:<variant>`` by path
  (``configs_dir``: the copy installed with memjax as ``memjax/configs``, or
  the checkout's ``configs/``) with the demo's data cache and steps;
* ``train`` trains a row's run, or reads back the results of a run of the
  same steps already finished in its directory, so an interrupted demo
  continues where it stopped; ``once`` and ``Stages`` keep the JSON of a
  stage after it (a datastore, a tuning, a usage count) the same way;
* ``Demo.finish`` writes ``table.json`` (the demo's results, the seconds,
  the machine and the markdown) and ``table.md`` with
  ``runfiles.write_table`` and prints the table; ``markdown`` builds it.

``run_rows`` is the whole of a demo with one table line per row (select,
run, finish). ``run`` is the demos' ``app.run``: warnings only unless
``--verbosity`` is given, and an error in the input ends the demo with one
line.

    python -m memjax.demos.common   # prints the configs directory
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import sys
import time
import types
from typing import Any, Callable, Iterable, Mapping, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# pylint: disable=g-import-not-at-top,g-bad-import-order
from absl import app
from absl import flags
from absl import logging

from memjax import errors
from memjax.io import paths
from memjax.checkpoints import runfiles

# The flags define_flags defines belong to the demo that calls it (they show
# in its --helpshort).
flags.disclaim_key_flags()

STEPS_HELP = "Override the training steps of every row."
UNIGRAM = "unigram (train counts, add-one)"


def configs_dir(package: str | None = None) -> str:
  """The directory of the experiment config files (``<dir>/<exp>.py``).

  Installed memjax carries them as ``memjax/configs``; a checkout has them
  in the repository's ``configs/``, beside the package.

  Args:
    package: the ``memjax`` package directory (default: this one's).

  Raises:
    errors.ConfigError: neither exists.
  """
  if package is None:
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  candidates = (
      os.path.join(package, "configs"),
      os.path.join(os.path.dirname(package), "configs"),
  )
  for path in candidates:
    if os.path.isdir(path):
      return path
  raise errors.ConfigError(
      f"no config files in {' or '.join(candidates)}: install memjax with "
      "pip (setup.py installs configs/ as memjax/configs) or run from a "
      "checkout"
  )


@functools.lru_cache(maxsize=None)
def load_config_file(path: str) -> types.ModuleType:
  """The config file at ``path``, loaded by path as a module of its own.

  Raises:
    errors.ConfigError: no file there.
  """
  if not os.path.isfile(path):
    raise errors.ConfigError(f"no config file {path}")
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"memjax_config_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(name: str, variant: str) -> Any:
  """``<configs_dir()>/<name>.py:<variant>``: a new ConfigDict."""
  path = os.path.join(configs_dir(), f"{name}.py")
  return load_config_file(path).get_config(variant)


@dataclasses.dataclass(frozen=True)
class Flags:
  """The holders of the flags every demo has (``.value`` once parsed).

  Attributes:
    workdir: ``--workdir``, the output directory.
    steps: ``--steps``, training steps of every row (None: no such flag).
    rows: ``--rows``, the keys of the rows to run (None: no such flag).
  """

  workdir: flags.FlagHolder
  steps: flags.FlagHolder | None = None
  rows: flags.FlagHolder | None = None


def define_flags(
    workdir: str,
    rows: str | None = None,
    rows_default: Sequence[str] | None = None,
    steps: str | None = STEPS_HELP,
    steps_default: int | None = None,
) -> Flags:
  """Defines ``--workdir`` and, given their help, ``--rows`` and ``--steps``.

  Args:
    workdir: the default output directory.
    rows: the help of ``--rows`` (None: the demo has no such flag).
    rows_default: the rows run by default (None: all).
    steps: the help of ``--steps`` (None: no such flag).
    steps_default: its default (None: each config's steps).

  Returns:
    The flag holders.
  """
  return Flags(
      workdir=flags.DEFINE_string("workdir", workdir, "Output directory."),
      steps=(
          None
          if steps is None
          else flags.DEFINE_integer("steps", steps_default, steps)
      ),
      rows=(
          None
          if rows is None
          else flags.DEFINE_list(
              "rows", None if rows_default is None else list(rows_default), rows
          )
      ),
  )


def slug(key: str) -> str:
  """A row's directory name: ``'vanilla + continuous cache'`` ->
  ``'vanilla___continuous_cache'``."""
  return "".join(c if c.isalnum() else "_" for c in key).strip("_").lower()


@dataclasses.dataclass(frozen=True)
class Row:
  """One row of a demo's table.

  Attributes:
    key: the name ``--rows`` selects it by; its directory is ``slug(key)``.
    label: its name in the table.
    config: the config file it trains (``<configs_dir()>/<config>.py``).
    variant: that file's variant (or the method a size is appended to).
    base: the key of the row whose run it reads or starts from ('' = none).
    options: what else the demo needs of the row (an evaluation memory,
      config overrides, a fine-tuning variant).
  """

  key: str
  label: str
  config: str = ""
  variant: str = ""
  base: str = ""
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def dirname(self) -> str:
    return slug(self.key)


def select(
    rows: Sequence[Row], keys: Iterable[str] | None, flag: str = "rows"
) -> list[Row]:
  """The rows named by ``keys`` in declared order (all when ``keys`` is
  empty or None).

  Raises:
    errors.ConfigError: a key names no row.
  """
  keys = list(keys or ())
  if not keys:
    return list(rows)
  known = [r.key for r in rows]
  unknown = [k for k in keys if k not in known]
  if unknown:
    raise errors.ConfigError(
        f"unknown --{flag} {unknown}; use a comma-separated subset of {known}"
    )
  return [r for r in rows if r.key in keys]


def jsonable(obj: Any) -> Any:
  """``obj`` as JSON reads it back (tuples as lists; other types as str)."""
  return json.loads(json.dumps(obj, default=str))


def read_json(path: str) -> Any:
  return paths.read_json(path)


def once(path: str, make: Callable[[], Mapping[str, Any]]) -> Any:
  """The JSON at ``path``, made first when it is missing.

  ``make()`` runs only then; unless it wrote ``path`` itself (a mode's own
  output file), its result less ``summary_lines`` is written there. Either
  way the file is read back, so a stage run now and one read from an
  earlier demo give the same values.
  """
  if not paths.exists(path):
    out = make()
    if not paths.exists(path):
      out = {k: v for k, v in out.items() if k != "summary_lines"}
      paths.makedirs(paths.dirname(path) or ".")
      paths.write_json(path, jsonable(out))
  return read_json(path)


class Stages:
  """Named stages of one run, each kept as ``<run_dir>/<name>.json``.

  A stage already there is read back, not run again; ``times`` holds the
  seconds each stage took in this process (reading back included).
  """

  def __init__(self, run_dir: str):
    self.run_dir = run_dir
    self.times: dict[str, float] = {}

  def __call__(self, name: str, make: Callable[[], Mapping[str, Any]]) -> Any:
    start = time.time()
    out = once(paths.join(self.run_dir, f"{name}.json"), make)
    self.times[name] = time.time() - start
    return out


def finished(run_dir: str, steps: int) -> dict[str, Any] | None:
  """The ``results.json`` of a run in ``run_dir`` that finished ``steps``
  steps; None when there is none (not run, interrupted, other steps)."""
  try:
    results = read_json(paths.join(run_dir, "results.json"))
  except (OSError, ValueError):
    return None
  if not isinstance(results, dict) or results.get("step") != steps:
    return None
  return results


def train(config: Any, run_dir: str) -> dict[str, Any]:
  """Trains and evaluates ``config`` in ``run_dir`` (resuming from its
  checkpoints), or reads back the results of a finished run there.

  A run trained now gets ``wall_s`` (its seconds in this process) in its
  results.
  """
  results = finished(run_dir, int(config.train.num_steps))
  if results is not None:
    print(f"reusing the finished run in {run_dir}", flush=True)
    return results
  from memjax import api  # pylint: disable=g-import-not-at-top

  start = time.time()
  results = api.train(config, run_dir)
  results["wall_s"] = time.time() - start
  paths.write_json(paths.join(run_dir, "results.json"), results)
  return results


def machine() -> str:
  """The machine line of a table: architecture, cores, accelerator, jax."""
  import platform

  import jax

  return (
      f"{platform.machine()}, {os.cpu_count()} CPU cores, "
      f"{jax.devices()[0].platform}, jax {jax.__version__}"
  )


def markdown(
    head: Sequence[str], align: str, body: Iterable[Sequence[Any]]
) -> str:
  """A markdown table: the ``head`` cells, the alignment line (``align``:
  'l' or 'r' per column), one line per row of ``body`` ('' leaves a cell
  blank)."""

  def line(cells: Sequence[Any]) -> str:
    return "|" + "|".join(f" {c} " if c != "" else " " for c in cells) + "|"

  rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
  return "\n".join([line(head), rule, *(line(c) for c in body)])


def tokens_per_s(row: Mapping[str, Any]) -> str:
  """A row's training tokens/s cell ('-' for a run trained earlier)."""
  tps = row.get("train_tokens_per_s")
  return f"{tps:.0f}" if tps else "-"


def unigram(rows: Sequence[Mapping[str, Any]], unit: str) -> list[str]:
  """The valid and test cells of the unigram floor (the first row's)."""
  u = rows[0]["unigram"]
  return [f"{u['valid'][unit]:.2f}", f"{u['test'][unit]:.2f}"]


class Demo:
  """One demo run: its output directory, its clock and its table.

  Attributes:
    workdir: the output directory (made here).
    start: when the demo started (``time.time()``).
  """

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.start = time.time()
    paths.makedirs(workdir)

  def run_dir(self, row: Row | str) -> str:
    """The directory of a row (or of the row with that key)."""
    return paths.join(
        self.workdir, row.dirname if isinstance(row, Row) else slug(row)
    )

  def config(self, name: str, variant: str, steps: int | None = None) -> Any:
    """``<name>.py:<variant>`` with the demo's data cache and, when given,
    ``steps`` training steps."""
    c = load_config(name, variant)
    c.data.cache_dir = paths.join(self.workdir, "cache")
    if steps:
      c.train.num_steps = int(steps)
    return c

  def finish(
      self,
      results: Mapping[str, Any],
      table: str,
      title: str = "",
      about: str = "",
  ) -> dict[str, Any]:
    """Writes ``table.json`` (``results``, the seconds, the machine and the
    markdown ``table``) and ``table.md``, prints the table, and returns
    what ``table.json`` holds.

    With a ``title`` the table is printed under ``title (about, <seconds>s
    on <machine>):``.
    """
    seconds = time.time() - self.start
    where = machine()
    out = dict(results, seconds=seconds, machine=where, markdown=table)
    out = runfiles.write_table(self.workdir, jsonable(out))
    if title:
      about = f"{about}, " if about else ""
      print(f"\n{title} ({about}{seconds:.0f}s on {where}):\n{table}\n")
    else:
      print(table)
    print(f"written: {paths.join(self.workdir, 'table.md')}", flush=True)
    return out


def run_rows(
    demo_flags: Flags,
    rows: Sequence[Row],
    run_row: Callable[[Demo, Row, int | None], dict[str, Any]],
    format_table: Callable[[list[dict[str, Any]]], str],
    about: str = "",
    title: str = "Demo corpus",
) -> tuple[Demo, list[dict[str, Any]]]:
  """A demo of one table line per row: runs the rows ``--rows`` selects
  (``run_row(demo, row, --steps)`` each), then writes and prints the table
  (``table.json``: ``{"rows": [...], ...}``) under ``title (about, <n>
  rows, ...)``. Returns the demo and the rows' results."""
  demo = Demo(demo_flags.workdir.value)
  steps = None if demo_flags.steps is None else demo_flags.steps.value
  results = [
      run_row(demo, row, steps) for row in select(rows, demo_flags.rows.value)
  ]
  about = ", ".join(a for a in (about, f"{len(results)} rows") if a)
  demo.finish({"rows": results}, format_table(results), title, about)
  return demo, results


def run(main: Callable[[], Any]) -> None:
  """``app.run(main)`` for a demo: logging at WARNING unless ``--verbosity``
  is given; an input error (``errors.UserError``) is printed as one line
  ``memjax: error: ...`` and ends the demo with status 2."""

  def wrapped(argv: list[str]) -> None:
    try:
      if len(argv) > 1:
        raise errors.ConfigError(
            f"unexpected arguments {argv[1:]}: the demo takes flags only"
        )
      if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
      main()
    except errors.UserError as e:
      print(f"memjax: error: {e}", file=sys.stderr)
      sys.exit(2)

  app.run(wrapped)


if __name__ == "__main__":
  print(configs_dir())
