"""Test set-up: eight fake CPU devices, so sharding tests can build meshes.

The flag must be set before jax is imported anywhere in the test process.
"""

import importlib.metadata
import os


def _compile_flags() -> str:
  """XLA compiles the suite's programs without LLVM's optimisations and,
  where jaxlib still has them (before 0.11), with its older elemental
  emitters instead of the MLIR fusion emitters: the models are tiny, so
  compiling them, not running them, takes most of the suite's time (each
  flag takes about a third off the compile-bound files' time; every
  numeric check passes either way). jaxlib 0.11 removed the older emitters
  and their flag, which XLA would refuse as unknown."""
  flags = "--xla_backend_optimization_level=0"
  major, minor = importlib.metadata.version("jaxlib").split(".")[:2]
  if (int(major), int(minor)) < (0, 11):
    flags += " --xla_cpu_use_fusion_emitters=false"
  return flags


COMPILE_FLAGS = _compile_flags()


def xla_flags(devices: int) -> str:
  """``XLA_FLAGS`` for a process of the suite with ``devices`` fake CPUs."""
  return f"--xla_force_host_platform_device_count={devices} {COMPILE_FLAGS}"


os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Reuse compiled XLA programs across test processes (the end-to-end tests run
# memjax.main in subprocesses that compile the same programs).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(__file__), "..", ".cache", "xla"),
)
# Every program, however quick to compile: the same small programs compile
# again in every process otherwise.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


import atexit  # pylint: disable=g-import-not-at-top,g-bad-import-order
import json  # pylint: disable=g-import-not-at-top,g-bad-import-order
import select  # pylint: disable=g-import-not-at-top,g-bad-import-order
import subprocess  # pylint: disable=g-import-not-at-top,g-bad-import-order
import sys  # pylint: disable=g-import-not-at-top,g-bad-import-order
import tempfile  # pylint: disable=g-import-not-at-top,g-bad-import-order
import traceback  # pylint: disable=g-import-not-at-top,g-bad-import-order

import pytest  # pylint: disable=g-import-not-at-top,g-bad-import-order

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Token caches shared by the locked and the newest environments (`make
# test-newest`): the locked one, which has SeqIO, tokenises into it; the
# newest, which has not, reads them there. Caches are named by the corpus
# files' content, so one folder serves every run and copy.
TOKEN_CACHE = os.environ.get(
    "MEMJAX_TEST_TOKENS", os.path.join(REPO, ".cache", "tokens")
)


# The test files that take longest (seconds of test time with a cold
# compilation cache, measured with `--durations=0`: 10 s or more), longest
# first, except that the planted MARGE corpus comes second. `make test`
# hands whole files to its two test processes in this order (--dist loadfile
# --no-loadscope-reorder), so the long ones start first and the processes
# finish together; the mode matrix (which trains most shared runs) and the
# planted corpus (which needs none) start side by side, so neither waits
# for the other's shared run.
LONGEST_FIRST = (
    "tests/test_mode_matrix.py",
    "tests/methods/marge/test_planted.py",
    "tests/benchmarks/test_accelerator_check.py",
    "tests/colabs/test_notebooks.py",
    "tests/models/test_stack.py",
    "tests/methods/trime/test_modes.py",
    "tests/run/test_restore.py",
    "tests/modes/test_plan.py",
    "tests/models/test_family_fixtures.py",
    "tests/test_main.py",
    "tests/models/test_variables.py",
    "tests/models/test_transformer_memory.py",
    "tests/test_multihost.py",
    "tests/methods/recurrent/test_modes.py",
    "tests/test_build.py",
    "tests/methods/pkm/test_sharded.py",
    "tests/methods/trime/test_pack_beam.py",
    "tests/methods/pkm/test_bert.py",
    "tests/io/test_optional.py",
    "tests/methods/pkm/test_layer.py",
    "tests/methods/trime/test_training.py",
    "tests/run/test_preemption.py",
    "tests/models/test_seq2seq.py",
    "tests/models/test_adaptive.py",
    "tests/modes/test_plan_fit.py",
    "tests/methods/external/test_memories.py",
    "tests/eval/test_memory_grid.py",
    "tests/test_bad_inputs.py",
    "tests/test_sharding.py",
)


def set_memory(c, **values):
  """Sets evaluation-memory keys of the config ``c`` in the sections that
  own them: the engine's ``eval_memory`` or a memory kind's (``trime``,
  ``cache``, ``external``)."""
  for key, value in values.items():
    owner = next(
        s for s in ("eval_memory", "trime", "cache", "external") if key in c[s]
    )
    c[owner][key] = value


def pytest_configure(config):
  config.addinivalue_line(
      "markers",
      "matrix: the mode matrix (tests/test_mode_matrix.py); run it alone "
      "with -m matrix",
  )
  config.addinivalue_line(
      "markers",
      "newest: also run on the newest releases within setup.py's ranges, "
      "as a stock JAX image has them (make test-newest)",
  )


def pytest_ignore_collect(collection_path, config):
  """Under ``-m newest``, a test file that marks no test ``newest`` is not
  imported: it may import what the newest environment lacks (TensorFlow,
  SeqIO, ScaNN)."""
  if config.getoption("markexpr") != "newest":
    return None
  if collection_path.suffix != ".py" or not collection_path.name.startswith(
      "test_"
  ):
    return None
  return "pytest.mark.newest" not in collection_path.read_text()


def pytest_collection_modifyitems(items):
  """Moves the files of ``LONGEST_FIRST`` to the front, in its order."""
  rank = {os.path.join(REPO, f): i for i, f in enumerate(LONGEST_FIRST)}
  if missing := [f for f in rank if not os.path.isfile(f)]:
    raise pytest.UsageError(f"LONGEST_FIRST names no test file: {missing}")
  items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


# The suite's shared trained runs and the configs they build.
pytest_plugins = ("tests.shared_runs",)


def run_main(*args, timeout=600, devices=1, env=None, fresh=False):
  """Runs ``memjax.main``'s command line ``args`` as a user would
  (``devices`` CPUs); returns the finished process (``returncode``,
  ``stdout``, ``stderr``).

  On one device, with no environment of its own, the command runs in this
  test process's long-lived ``memjax.main`` (``MainServer``), through
  ``memjax.main.cli``: the same flags, output and exit status without
  starting an interpreter, JAX and TensorFlow again. ``fresh``, a mode that
  acts before JAX starts (``--mode=plan`` sets the device count) and
  ``--multihost`` run in a new ``python -m memjax.main``.
  """
  if devices == 1 and env is None and not fresh and not _needs_fresh(args):
    return _SERVER.run(args, timeout)
  full = dict(os.environ)
  full["XLA_FLAGS"] = xla_flags(devices)
  full.update(env or {})
  return subprocess.run(
      [sys.executable, "-m", "memjax.main", *args],
      cwd=REPO,
      env=full,
      capture_output=True,
      text=True,
      timeout=timeout,
  )


def _needs_fresh(args) -> bool:
  """Whether a command line must start its own interpreter: ``--multihost``
  or a mode with a ``before_jax`` step (``extend.Mode``)."""
  from memjax import dispatch  # pylint: disable=g-import-not-at-top
  from memjax import errors  # pylint: disable=g-import-not-at-top

  modes = [a.split("=", 1)[1] for a in args if a.startswith("--mode=")]
  try:
    mode = dispatch.mode_of(modes[-1] if modes else "train")
  except errors.UserError:  # The command itself says so, in one line.
    return "--multihost" in args
  return mode.before_jax is not None or "--multihost" in args


class MainServer:
  """``memjax.main`` kept running for this test process, on one CPU device:
  command lines in, exit statuses out (``serve``). Started on first use
  (again if it died), stopped when the test process exits.

  One JSON object a line: the request on the server's stdin, ``{"id": N,
  "argv": [...], "stdout": PATH, "stderr": PATH}``; the reply on its
  stdout, ``{"id": N, "returncode": N}``, once the command has finished
  with its output in the two files. A reply of another request (one left
  behind by an interrupted call) fails the call instead of answering it.
  """

  def __init__(self):
    self.proc = None
    self.requests = 0

  def _start(self):
    self.proc = subprocess.Popen(
        [sys.executable, "-c", "from tests import conftest; conftest.serve()"],
        cwd=REPO,
        env=dict(os.environ, XLA_FLAGS=xla_flags(1)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

  def stop(self):
    if self.proc is not None and self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    self.proc = None

  def run(self, args, timeout: float) -> subprocess.CompletedProcess:
    """Runs one command line; as ``subprocess.run(..., timeout=timeout)``
    raises ``TimeoutExpired`` (and stops the server) when it runs longer."""
    if self.proc is None or self.proc.poll() is not None:
      self._start()
    command = [sys.executable, "-m", "memjax.main", *args]
    with tempfile.TemporaryDirectory() as tmp:
      out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
      self.requests += 1
      request = {
          "id": self.requests,
          "argv": list(args),
          "stdout": out,
          "stderr": err,
      }
      self.proc.stdin.write(json.dumps(request) + "\n")
      self.proc.stdin.flush()
      ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
      if not ready:
        self.stop()
        raise subprocess.TimeoutExpired(command, timeout)
      reply = self.proc.stdout.readline()
      if reply:
        answer = json.loads(reply)
        assert answer["id"] == request["id"], (answer, request)
        returncode = answer["returncode"]
      else:  # The server died with the command (a crash in XLA, say).
        returncode = self.proc.wait()
        self.proc = None
      with open(out, encoding="utf-8", errors="replace") as f:
        stdout = f.read()
      with open(err, encoding="utf-8", errors="replace") as f:
        stderr = f.read()
    return subprocess.CompletedProcess(command, returncode, stdout, stderr)


def serve() -> None:
  """The server's side of ``MainServer``: runs each requested command line
  with ``memjax.main.cli``, file descriptors 1 and 2 pointing at the
  request's files meanwhile (what XLA or TensorFlow print lands there too).
  A bug in memjax prints its traceback there and answers 1, as ``python``
  exits. Ends when the test process closes the pipe."""
  from memjax import main  # pylint: disable=g-import-not-at-top

  # The pipes to the test process, kept apart from the commands' output.
  requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
  replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
  quiet = os.open(os.devnull, os.O_RDWR)
  os.dup2(quiet, 0)
  for line in requests:
    request = json.loads(line)
    with open(request["stdout"], "wb") as out:
      with open(request["stderr"], "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
          status = main.cli(request["argv"])
        except Exception:  # pylint: disable=broad-except
          traceback.print_exc()
          status = 1
        finally:
          sys.stdout.flush()
          sys.stderr.flush()
          os.dup2(quiet, 1)
          os.dup2(quiet, 2)
    replies.write(json.dumps({"id": request["id"], "returncode": status}))
    replies.write("\n")
    replies.flush()


_SERVER = MainServer()
atexit.register(_SERVER.stop)
