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


class Progress:
  """Counts items of a long job and prints a rate and ETA line at most every
  ``every_s`` seconds (e.g. the keys a datastore build has written); with
  ``expected`` 0 (a total not known in advance) the line has no ETA."""

  def __init__(
      self,
      expected: int,
      what: str = "datastore",
      unit: str = "keys",
      every_s: float = 10.0,
  ):
    self.start = self.last = time.time()
    self.expected, self.done = expected, 0
    self.what, self.unit, self.every_s = what, unit, every_s

  def add(self, n: int, label: str) -> None:
    """Adds ``n`` items done; ``label`` says where the job is."""
    self.done += n
    if time.time() - self.last > self.every_s:
      self.last = time.time()
      rate = self.done / (self.last - self.start)
      line = f"{self.what}: {label}, {self.done} {self.unit}, "
      line += f"{rate:.0f} {self.unit}/s"
      if self.expected:  # Unknown totals (0) get no ETA.
        eta = max(self.expected - self.done, 0) / max(rate, 1e-9)
        line += f", ETA {eta:.0f}s"
      info("%s", line)


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
