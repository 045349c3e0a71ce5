"""``memjax.main`` kept running for the suite: command lines in, statuses out.

Starting ``python -m memjax.main`` costs an interpreter, JAX, TensorFlow and
every module of memjax again (1.5 to 4 s on a 2-core machine) before the
command does anything. Each test process starts one server instead
(``conftest.run_main``), with the devices a command would get, and the
server runs each command line with ``memjax.main.cli``: the command's own
flag parsing, ``absl.app.run``, its prints and its exit status.

The protocol, one JSON object a line: the request on the server's stdin,
``{"argv": [...], "stdout": PATH, "stderr": PATH}``; the reply on its
stdout, ``{"returncode": N}``, once the command has finished with its
output in the two files (file descriptors 1 and 2 point at them while it
runs, so what XLA or TensorFlow print lands there too). A bug in memjax
prints its traceback there and answers 1, as ``python`` exits.

    python -m tests.main_server   # from the repository root
"""

import json
import os
import sys
import traceback


def _serve(requests, replies) -> None:
  from memjax import main  # pylint: disable=g-import-not-at-top

  quiet = os.open(os.devnull, os.O_RDWR)
  os.dup2(quiet, 0)
  for line in requests:
    request = json.loads(line)
    with (
        open(request["stdout"], "wb") as out,
        open(request["stderr"], "wb") as err,
    ):
      os.dup2(out.fileno(), 1)
      os.dup2(err.fileno(), 2)
      try:
        status = main.cli(request["argv"])
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()  # As python prints a bug's traceback.
        status = 1
      finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
    replies.write(json.dumps({"returncode": status}) + "\n")
    replies.flush()


if __name__ == "__main__":
  # The pipes to the test process, kept apart from the descriptors that the
  # commands' output goes to.
  _serve(
      os.fdopen(os.dup(0), "r", encoding="utf-8"),
      os.fdopen(os.dup(1), "w", encoding="utf-8"),
  )
