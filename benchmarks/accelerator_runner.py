"""The accelerator check's processes: items one by one, plans alongside.

``Check.run`` probes the machine, starts ``--mode=plan`` for every trained
item on the host's CPU (``Plans``: ``--plan_jobs`` at a time, each in its
own ``python -m memjax.main`` process, JAX on the CPU), then runs the items
one after another, each in its own process
(``benchmarks/accelerator_measure.py``), with the budget checked between
items and enforced on a running one (it is stopped at the deadline). The
report is saved after every item and every plan. This process never
starts JAX on a device, so the items' processes own it one at a time.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

from benchmarks import accelerator_report as report_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURE = os.path.join(REPO, "benchmarks", "accelerator_measure.py")
# What memjax imports that a stock JAX image may lack (module: package).
NEEDED = {
    "jax": "jax",
    "flax": "flax",
    "optax": "optax",
    "absl": "absl-py",
    "yaml": "PyYAML",
    "ml_collections": "ml_collections",
}
_START = time.monotonic()


def log(line: str) -> None:
  """A progress line on stderr, with the seconds since the start."""
  print(f"[{time.monotonic() - _START:6.1f} s] {line}", file=sys.stderr)
  sys.stderr.flush()


def missing_modules() -> list[str]:
  """The packages of ``NEEDED`` that do not import."""
  return [p for m, p in NEEDED.items() if importlib.util.find_spec(m) is None]


def missing_line(missing: Sequence[str]) -> str:
  """One line naming what is missing and how to bring it."""
  hints = []
  if set(missing) - {"ml_collections"}:
    hints.append(
        "run it with a Python that has JAX (make accelerator-check "
        "ACCEL_PYTHON=/path/to/python)"
    )
  if "ml_collections" in missing:
    hints.append(
        "ml_collections is pure Python: put its wheel on the path (make "
        "accelerator-check ACCEL_PATH=/path/to/"
        "ml_collections-1.1.0-py3-none-any.whl)"
    )
  return (
      f"accelerator_check: error: {', '.join(missing)} not installed for "
      f"{sys.executable}; {'; '.join(hints)}"
  )


def child_env() -> dict[str, str]:
  """This environment with the repository first on PYTHONPATH."""
  env = dict(os.environ)
  path = env.get("PYTHONPATH", "")
  env["PYTHONPATH"] = REPO + (os.pathsep + path if path else "")
  return env


def _last_line(lines: Sequence[str]) -> str:
  text = [l.strip() for l in lines if l.strip()]
  return text[-1][:300] if text else "no output"


class Plans:
  """``--mode=plan`` processes for one platform, a few at a time.

  Each plan runs in ``<root>/<item>-<platform>-<hash>/`` beside the
  request it answers (``request.json``); a finished one is reused by a
  later check with the same request.
  """

  def __init__(self, root: str, platform: str, jobs: int, save: Callable):
    self.root, self.platform, self.jobs, self.save = root, platform, jobs, save
    self.waiting: list[tuple[dict, dict, str]] = []
    self.running: dict[str, tuple[subprocess.Popen, dict, dict, float]] = {}

  def add(self, row: dict, config: str, overrides: list[str], dtype: str):
    """Plans ``row``'s config (a cached plan is read at once)."""
    request = {
        "config": config,
        "overrides": list(overrides),
        "platform": self.platform,
        "dtype": dtype,
    }
    key = hashlib.sha1(json.dumps(request).encode()).hexdigest()[:10]
    workdir = os.path.join(self.root, f"{row['name']}-{self.platform}-{key}")
    row["plan"] = {"status": report_lib.PENDING, "workdir": workdir}
    self.waiting = [w for w in self.waiting if w[0] is not row]
    try:
      with open(os.path.join(workdir, "request.json")) as f:
        cached = json.load(f) == request
      if cached and os.path.exists(os.path.join(workdir, "plan.json")):
        self._read(row, request, workdir, 0, cached=True)
        return
    except (OSError, ValueError):
      pass
    self.waiting.append((row, request, workdir))

  def _command(self, request: dict, workdir: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "memjax.main",
        "--mode=plan",
        f"--workdir={workdir}",
        f"--config={request['config']}",
        f"--config.plan.platform={self.platform}",
        "--config.plan.devices=1",
        "--config.plan.fit_batch=False",
        # The check measures train steps: the plan's evaluation step is
        # not compiled.
        "--config.plan.eval_step=False",
        # On fake CPU devices: a libtpu topology could reach for the TPU
        # that the items use.
        "--config.plan.tpu_topology=False",
        f"--config.plan.dtypes=('{request['dtype']}',)",
        *[f"--config.{o}" for o in request["overrides"]],
    ]

  def _read(self, row, request, workdir, rc, cached=False) -> None:
    """Puts a finished plan's predictions (or its failure) in ``row``."""
    if row["plan"].get("workdir") != workdir:
      return  # Planned again since (another batch).
    try:
      with open(os.path.join(workdir, "plan.json")) as f:
        plan = json.load(f)
      out = report_lib.predictions(plan, request["dtype"])
      out["seconds"] = plan.get("seconds")
    except (OSError, ValueError, KeyError):
      with open(os.path.join(workdir, "plan.log"), errors="replace") as f:
        tail = _last_line(f.readlines())
      out = {"status": f"n/a: plan failed (status {rc}): {tail}"}
    out.update(workdir=workdir, cached=cached)
    row["plan"] = out
    log(f"plan of {row['name']}: {out['status']}")

  def poll(self) -> None:
    """Collects finished plans and starts waiting ones."""
    for key, (proc, row, request, _) in list(self.running.items()):
      if proc.poll() is not None:
        del self.running[key]
        self._read(row, request, key, proc.returncode)
        self.save()
    while self.waiting and len(self.running) < self.jobs:
      row, request, workdir = self.waiting.pop(0)
      os.makedirs(workdir, exist_ok=True)
      for name in ("plan.json", "plan.md"):
        if os.path.exists(os.path.join(workdir, name)):
          os.remove(os.path.join(workdir, name))
      with open(os.path.join(workdir, "request.json"), "w") as f:
        json.dump(request, f, indent=2)
      with open(os.path.join(workdir, "plan.log"), "w") as logf:
        proc = subprocess.Popen(
            self._command(request, workdir),
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=child_env(),
        )
      self.running[workdir] = (proc, row, request, time.monotonic())
      log(f"plan of {row['name']}: started ({self.platform}, 1 device)")

  def busy(self) -> bool:
    return bool(self.waiting or self.running)

  def stop(self) -> None:
    """Stops what is left: running plans unfinished, waiting ones skipped."""
    for workdir, (proc, row, _, started) in self.running.items():
      proc.kill()
      proc.wait()
      if row["plan"].get("workdir") != workdir:
        continue  # Planned again since (another batch).
      row["plan"]["status"] = (
          "n/a: plan not finished within the budget "
          f"({time.monotonic() - started:.0f} s)"
      )
    for row, _, _ in self.waiting:
      row["plan"]["status"] = f"n/a: {report_lib.SKIPPED_BUDGET}"
    self.running, self.waiting = {}, []


class Check:
  """Runs the check's items within its budget, saving after each step."""

  def __init__(self, report: dict, args: argparse.Namespace, save: Callable):
    self.report, self.args, self.save = report, args, save
    self.rows = {r["name"]: r for r in report["rows"]}
    self.start = time.monotonic()
    self.deadline = self.start + args.budget_s
    self.plans: Plans | None = None

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def worker(self, name: str, spec: dict) -> dict[str, Any]:
    """Runs one item's process (its output forwarded); stops it at the
    deadline. Returns its result, or an error naming how it ended."""
    with tempfile.TemporaryDirectory() as tmp:
      spec_path, result_path = (os.path.join(tmp, f) for f in ("s", "r"))
      with open(spec_path, "w") as f:
        json.dump(spec, f)
      proc = subprocess.Popen(
          [sys.executable, MEASURE, f"--spec={spec_path}"]
          + [f"--result={result_path}"],
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
          errors="replace",
          cwd=REPO,
          env=child_env(),
      )
      tail = collections.deque(maxlen=20)

      def forward():
        for line in proc.stdout:
          tail.append(line)
          print(f"    {name} | {line.rstrip()}", file=sys.stderr, flush=True)

      reader = threading.Thread(target=forward, daemon=True)
      reader.start()
      started, stopped = time.monotonic(), False
      try:
        while proc.poll() is None:
          if self.left() <= 0:
            proc.kill()
            stopped = True
          if self.plans is not None:
            self.plans.poll()
          try:
            proc.wait(timeout=1.0)
          except subprocess.TimeoutExpired:
            pass
      finally:  # Interrupted: the item's process goes too.
        if proc.poll() is None:
          proc.kill()
          proc.wait()
      reader.join(timeout=5)
      seconds = time.monotonic() - started
      if stopped:
        return {"status": f"error: stopped at the budget after {seconds:.0f} s"}
      try:
        with open(result_path) as f:
          return json.load(f)
      except (OSError, ValueError):
        return {
            "status": f"error: exited with status {proc.returncode}: "
            f"{_last_line(list(tail))}"
        }

  def probe(self) -> str | None:
    """The machine (its own process) and the plan platform of its device."""
    if self.args.plans_only:
      self.report["machine"] = {"status": "skipped: plans only"}
      return self.args.platform
    if self.left() <= 0:
      self.report["machine"] = {"status": report_lib.SKIPPED_BUDGET}
      return None
    log("machine: probing the devices")
    result = self.worker("machine", {"kind": "machine"})
    machine = result.get("machine", {"status": result["status"]})
    self.report["machine"] = machine
    kind = machine.get("device_kind")
    if self.args.platform:
      return self.args.platform
    return None if kind is None else report_lib.plan_platform(kind)

  def start_plans(self, platform: str | None, items: Sequence) -> None:
    """Queues a plan per selected trained item (or says why there is none)."""
    kind = self.report["machine"].get("device_kind")
    for name, _, planned in items:
      row = self.rows[name]
      if planned is None or row["status"] == report_lib.SKIPPED_UNSELECTED:
        continue
      if platform is None:
        reason = self.report["machine"].get("status", "")
        row["plan"]["status"] = (
            report_lib.no_platform(kind) if kind else f"n/a: machine {reason}"
        )
      elif self.plans is None:
        row["plan"]["status"] = f"n/a: {report_lib.SKIPPED_BUDGET}"
      else:
        self.plans.add(row, planned.config, planned.overrides, planned.dtype)
    if self.plans is not None:
      self.plans.poll()

  def item(self, name: str, spec: dict, planned: Any) -> None:
    """Runs one item and records it; plans it again at another batch."""
    row = self.rows[name]
    log(f"{name}: starting ({row['config']})")
    started = time.monotonic()
    result = self.worker(name, spec)
    row["seconds"] = time.monotonic() - started
    row["status"] = result["status"]
    if "measured" in result:
      row["measured"] = result["measured"]
    overrides = result.get("overrides")
    if overrides is not None and overrides != row["overrides"]:
      row["overrides"] = overrides
      if self.plans is not None and planned is not None:
        self.plans.add(row, planned.config, overrides, planned.dtype)
    log(f"{name}: {row['status']} in {row['seconds']:.0f} s")

  def run(self, items: Sequence[tuple[str, dict, Any]]) -> None:
    """Every item in order, then the plans until the deadline; what is
    left is "skipped: budget" (or "skipped: interrupted" on Ctrl-C)."""
    reason = report_lib.SKIPPED_BUDGET
    try:
      platform = self.probe()
      self.report["plan_platform"] = platform
      if platform is not None and self.left() > 0:
        root = os.path.abspath(os.path.join(self.args.out, "plans"))
        self.plans = Plans(root, platform, self.args.plan_jobs, self.save)
      self.start_plans(platform, items)
      self.save()
      for name, spec, planned in items:
        row = self.rows[name]
        if row["status"] != report_lib.PENDING:
          continue
        if self.args.plans_only:
          row["status"] = "skipped: plans only"
        elif self.left() <= 0:
          row["status"] = report_lib.SKIPPED_BUDGET
        else:
          self.item(name, spec, planned)
        self.save()
      while self.plans is not None and self.plans.busy() and self.left() > 0:
        self.plans.poll()
        time.sleep(0.5)
    except KeyboardInterrupt:
      reason = "skipped: interrupted"
      self.report["interrupted"] = True
      raise
    finally:
      if self.plans is not None:
        self.plans.stop()
      for row in self.rows.values():
        if row.get("plan", {}).get("status") == report_lib.PENDING:
          row["plan"]["status"] = f"n/a: {reason}"
        if row["status"] == report_lib.PENDING:
          row["status"] = reason
      self.report["elapsed_s"] = time.monotonic() - self.start
      self.save()
