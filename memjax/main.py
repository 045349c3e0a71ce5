"""Command-line entry point.

    python -m memjax.main --config=configs/trime_wt103.py:demo --workdir=runs/demo
    python -m memjax.main --config=configs/trime_wt103.py:demo --workdir=runs/demo --mode=eval

Any config value can be overridden with ``--config.key=value``; unknown keys
are rejected. Bad input (missing data, a mesh that does not fit, a checkpoint
of another model) exits with status 2 and one line naming what to fix; files
already in the workdir are left as they are.

With ``--multihost`` every process runs the same command with its own
``--process_id`` (or the cluster supplies the ids), e.g. two CPU processes on
one machine (``jax_cpu_collectives_implementation`` is ``gloo`` by default):

    python -m memjax.main --config=... --workdir=DIR --multihost
        --coordinator_address=127.0.0.1:PORT --num_processes=2 --process_id=I

Each process builds the same global batches and places its devices' slices;
all take part in checkpoints; process 0 writes the logs and results.

SIGTERM (a preemption) or Ctrl-C during training writes a checkpoint of the
last update and exits with status 128 + the signal's number (143, 130); the
same command resumes (memjax/run/preemption.py).

A training job holds its workdir's lease (memjax/run/ownership.py): a
second job training into it stops with one line naming the holder (exit
status 2); a lease left by a killed job is taken over.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file, e.g. configs/trime_wt103.py:demo.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")


def _mode_help() -> str:
  """--mode's help: every mode with the run kinds it takes
  (``memjax.build.parts``)."""
  from memjax import build  # pylint: disable=g-import-not-at-top

  lines = "\n".join(build.parts().modes_table())
  return (
      "What to do with the run; 'list' prints the modes with the kinds of run "
      "(task/model.family) each takes:\n" + lines
  )


# The modes are the engine's and the methods' (memjax.build.parts), each run on
# the run built from the config by memjax.dispatch.run_mode, which returns its
# results dict.
_MODE = flags.DEFINE_string("mode", "train", _mode_help())
_MULTIHOST = flags.DEFINE_bool(
    "multihost",
    False,
    "Call jax.distributed.initialize() (TPU pods, multi-node GPU, several "
    "CPU processes); coordinator and process ids come from the environment "
    "or from the flags below.",
)

_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0 (with --multihost, "
    "where the cluster is not detected automatically).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "With --multihost."
)
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "With --multihost.")

_EXPORT_DIR = flags.DEFINE_string(
    "export_dir",
    None,
    "--mode=export: output directory (default " "<workdir>/export).",
)
_EXPORT_DTYPE = flags.DEFINE_enum(
    "export_dtype",
    None,
    ["float32", "bfloat16"],
    "--mode=export: dtype of the stored parameters (default float32).",
)
_EXPORT_FORMAT = flags.DEFINE_enum(
    "export_format",
    None,
    ["memjax", "hf"],
    "--mode=export: memjax's export (default) or, for an imported model, a "
    "Hugging Face folder.",
)


def _config_file_error(text: str) -> str:
  """The config file's own error in a flag error that quotes its traceback
  ('flag --config=F:V: Error whilst parsing config file: Traceback ...'):
  the flag and the last line, without the exception's module path."""
  head = text.split(": Error whilst parsing config file", 1)[0]
  last = [l.strip() for l in text.splitlines() if l.strip()][-1]
  name, sep, message = last.partition(": ")
  if sep and name.startswith("memjax.errors."):
    last = message  # One of ours: its message says what to fix.
  return f"{head}: {last}"


def _one_line(e: BaseException) -> str:
  """A flag-parsing error's message on one line, naming the flag."""
  text = str(e)
  if "Error whilst parsing config file" in text and "Traceback" in text:
    msg = _config_file_error(text)
  elif isinstance(e, flags.IllegalFlagValueError) or "--config." in text:
    msg = text
  else:
    root = e
    while root.__cause__ is not None or root.__context__ is not None:
      root = root.__cause__ or root.__context__
    msg = str(root).strip("\"'")
    if isinstance(root, (KeyError, AttributeError)):
      msg = (
          f"unknown config key {msg}: check the --config.* overrides against "
          "the settings classes (memjax/settings/sections.py, "
          "memjax/tasks/config.py, "
          "memjax/methods/*/config.py)"
      )
  lines = [l.strip() for l in msg.splitlines() if l.strip()]
  return " ".join(lines) or type(e).__name__


def _unknown_option(argv: list[str]) -> str | None:
  """For an override of a kind's option the config lacks
  (``--config.model.feed_forward_options.NAME=...``), the line naming the
  kind's options (``memjax.config.check_overrides``); else None."""
  from memjax import config as config_lib  # pylint: disable=g-import-not-at-top

  try:
    return config_lib.check_overrides(argv)
  except Exception:  # pylint: disable=broad-except
    return None  # The config itself fails: its own error is reported.


_HELP = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull")


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags and loads the config; any problem is reported as one line.

  ``--help`` prints the flags and exits 0 (absl's own help flag exits 1).
  """
  if any(a in _HELP for a in argv[1:]):
    # This module's flags, under the name absl filed them by: the script's
    # path for `python -m memjax.main`, 'memjax.main' for the console script
    # and ``cli`` (absl's main_module_help finds only the former).
    ours = flags.FLAGS.find_module_defining_flag(_WORKDIR.name)
    full = "--helpfull" in argv[1:]
    print(flags.FLAGS.module_help(ours) if not full else flags.FLAGS)
    sys.exit(0)
  argv = _translate_moved_keys(argv)
  try:
    rest = flags.FLAGS(argv)
    if _CONFIG.value is not None:
      _ = _CONFIG.value.name  # The config file loads lazily: load it now.
    return rest
  except Exception as e:  # pylint: disable=broad-except
    line = _unknown_option(argv) or _one_line(e)
    print(f"memjax: error: {line}", file=sys.stderr)
    sys.exit(2)


def _translate_moved_keys(argv: list[str]) -> list[str]:
  """``argv`` (and ``sys.argv``, which ml_collections reads its overrides
  from) with ``--config.OLD=...`` overrides of keys that moved rewritten to
  their new keys, each named on one line."""
  if not any(a.startswith("--config.") for a in argv):
    return argv
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax import settings as settings_lib  # pylint: disable=g-import-not-at-top

  table = build.parts().renames
  out = settings_lib.translate_argv(argv, table)
  if sys.argv[1:] == list(argv[1:]):
    sys.argv[1:] = out[1:]
  else:
    sys.argv[:] = settings_lib.translate_argv(sys.argv, table)
  return out


def overrides() -> dict[str, Any]:
  """The config values the command line's own flags set (--export_dir,
  --export_dtype, --export_format)."""
  out = {}
  if _EXPORT_DIR.value:
    out["export.dir"] = _EXPORT_DIR.value
  if _EXPORT_DTYPE.value:
    out["export.dtype"] = _EXPORT_DTYPE.value
  if _EXPORT_FORMAT.value:
    out["export.format"] = _EXPORT_FORMAT.value
  return out


def report(results: dict[str, Any], workdir: str) -> None:
  """Prints a mode's results: files, summary lines, or split metrics."""
  if "files" in results:
    for path in results["files"]:
      print(f"written: {path}")
    return
  if "unit" not in results or "summary_lines" in results:
    for line in results.get("summary_lines", ()):
      print(line)
    path = results.get("results_path", _results_path(workdir))
    print(f"results: {path}")
    return
  unit = results["unit"]
  for split, r in results.items():
    if not (isinstance(r, dict) and unit in r and "nll" in r):
      continue
    print(
        f"{split}: {unit} {r[unit]:.4f} (nll {r['nll']:.4f} over "
        f"{int(r['tokens'])} tokens; unigram "
        f"{results['unigram'][split][unit]:.2f})"
    )
  print(f"results: {_results_path(workdir)}")


def _results_path(workdir: str) -> str:
  from memjax.io import paths  # pylint: disable=g-import-not-at-top

  return paths.join(workdir, "results.json")


def print_modes() -> None:
  """``--mode=list``: every mode, the run kinds it takes and what it does."""
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax import extend  # pylint: disable=g-import-not-at-top

  print("modes (--mode=NAME), the runs they take, what they do:")
  for line in build.parts().modes_table():
    print(f"  {line}")
  print("run kinds (task/model.family):")
  for kind, text in extend.RUN_KINDS.items():
    print(f"  {kind:<15} {text}")


def main(argv):
  if len(argv) > 1:
    print(
        f"memjax: error: unexpected arguments {argv[1:]}: every setting is a "
        "flag (--mode=NAME, --config.key=value); --help lists them",
        file=sys.stderr,
    )
    sys.exit(2)
  if _MODE.value == "list":
    print_modes()
    return
  if not _WORKDIR.value:
    print("memjax: error: --workdir is required", file=sys.stderr)
    sys.exit(2)
  if not flags.FLAGS["verbosity"].present:
    # Library chatter (Orbax, CLU, TensorFlow) only at WARNING by default; our
    # own progress lines go to stdout. --verbosity=0 shows it all.
    logging.set_verbosity(logging.WARNING)
  import jax  # pylint: disable=g-import-not-at-top

  from memjax import dispatch  # pylint: disable=g-import-not-at-top
  from memjax import errors  # pylint: disable=g-import-not-at-top
  from memjax.run import preemption  # pylint: disable=g-import-not-at-top

  workdir = _WORKDIR.value
  try:
    dispatch.mode_of(_MODE.value)  # An unknown mode: one line, before JAX.
    if _MULTIHOST.value:
      jax.distributed.initialize(
          coordinator_address=_COORDINATOR.value,
          num_processes=_NUM_PROCESSES.value,
          process_id=_PROCESS_ID.value,
      )
    results = dispatch.run_mode(
        _MODE.value, _CONFIG.value, workdir, overrides()
    )
  except errors.UserError as e:
    # Input problems: one line. Any other exception is a bug in our code and
    # keeps its traceback.
    print(f"memjax: error: {e}", file=sys.stderr)
    sys.exit(2)
  except preemption.Preempted as e:
    # The loop saved a checkpoint and said so; 143 for SIGTERM tells
    # schedulers the run did not finish (memjax/run/preemption.py).
    sys.exit(e.exit_status)
  if jax.process_index() != 0:
    return  # Process 0 wrote the results and reports them.
  report(results, workdir)


def run() -> None:
  """The ``memjax`` console script: ``python -m memjax.main``."""
  app.run(main, flags_parser=parse_flags)


def cli(argv: Sequence[str]) -> int:
  """Runs one command line in this process, as ``python -m memjax.main``
  runs it; returns its exit status.

      status = cli(["--config=configs/trime_wt103.py:smoke",
                    "--workdir=runs/smoke", "--mode=eval"])

  Each call parses its flags anew (none carry over from an earlier call)
  and goes through ``run``, so it prints and exits as the command does: a
  problem with the input is one line on stderr and status 2. A bug in our
  code raises, with its traceback. What cannot change once JAX has started
  stays as this process started it: the number of devices, so a
  ``--mode=plan`` for more fake devices than the process has needs a fresh
  ``python -m memjax.main``.

  Args:
    argv: the command line's arguments, without the program name.

  Returns:
    The exit status: 0, 2 for bad input, 128 + the signal's number for a
    training run stopped by a signal.
  """
  saved = sys.argv
  # ml_collections reads the --config.* overrides from sys.argv itself.
  sys.argv = [os.path.abspath(__file__), *argv]
  try:
    _forget_flags()
    run()
  except SystemExit as e:  # What the command exits with.
    if e.code is None or isinstance(e.code, int):
      return int(e.code or 0)
    print(e.code, file=sys.stderr)
    return 1
  finally:
    sys.argv = saved
  return 0


def _forget_flags() -> None:
  """Back to no flags parsed: the --config.* override flags an earlier
  parse defined are removed, every other flag goes back to its default."""
  prefix = _CONFIG.name + "."
  for name in [n for n in flags.FLAGS if n.startswith(prefix)]:
    delattr(flags.FLAGS, name)
  flags.FLAGS.unparse_flags()


if __name__ == "__main__":
  run()
