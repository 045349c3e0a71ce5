"""Console progress lines for long work (training, evaluation, indexing).

Library logs (Orbax, CLU, TensorFlow) go through absl logging at its own
verbosity; the lines a researcher watches go to stdout from process 0 only.
"""

from __future__ import annotations

import sys
import time

import jax


def info(msg: str, *args) -> None:
  """Prints one timestamped line on process 0."""
  if jax.process_index() != 0:
    return
  text = msg % args if args else msg
  sys.stdout.write(f"[memjax {time.strftime('%H:%M:%S')}] {text}\n")
  sys.stdout.flush()


def warn(msg: str, *args) -> None:
  """Prints one timestamped warning line on process 0 (to stderr)."""
  if jax.process_index() != 0:
    return
  text = msg % args if args else msg
  sys.stderr.write(f"[memjax {time.strftime('%H:%M:%S')}] warning: {text}\n")
  sys.stderr.flush()
