"""The memjax modules and classes one training step's path runs through.

A maintainer follows a run from its config to the loss of one train step:
the run built (``memjax.build.build``: settings read and checked, task and
mesh), the model, optimiser and objective made, the abstract train state
laid out and the train step traced and lowered once. This script records
every memjax function called on that path (``sys.setprofile``) and prints
the modules and the classes whose code ran, besides ``io/`` and
``checkpoints/`` (storage, which the path only touches). The plan's own
helpers (the abstract batch, the vocabulary size) are not counted: they
stand in for the data the loop reads.

A module counts when one of its functions runs; a class when one of its
methods does. Records whose fields are only read (the settings sections,
an ``extend.Method``) do not count, though a reader looks them up.
``--lines`` also counts the lines that ran in each module beside the lines
it holds (``sys.settrace``; slower), which says how much of a module on the
path the path itself uses, and the lines of the functions that ran: what a
reader following the calls reads (each function whole, its docstring and
decorators too).

    python benchmarks/code_path.py --config=configs/trime_wt103.py:trime_7m \\
        [--functions] [--lines] [--out=path.json]
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import dataclasses
import json
import os
import sys
from typing import Any, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,g-bad-import-order
from benchmarks import harness
import memjax
from memjax import build
from memjax import sharding
from memjax.checkpoints import checkpointing
from memjax.modes import plan_compile
from memjax.run import step as step_lib

# pylint: enable=g-import-not-at-top,g-bad-import-order

PACKAGE = os.path.dirname(os.path.abspath(memjax.__file__)) + os.sep
# Storage, which the path touches but a reader of the step does not follow.
LEFT_OUT = ("memjax/io/", "memjax/checkpoints/")


@dataclasses.dataclass
class Path:
  """What ran: {module: {function: calls}}, {(module, class): calls} and,
  when lines are recorded, {module: line numbers that ran}."""

  functions: dict[str, collections.Counter] = dataclasses.field(
      default_factory=lambda: collections.defaultdict(collections.Counter)
  )
  classes: collections.Counter = dataclasses.field(
      default_factory=collections.Counter
  )
  lines: dict[str, set[int]] = dataclasses.field(
      default_factory=lambda: collections.defaultdict(set)
  )

  def modules(self) -> list[str]:
    """The modules on the path besides ``LEFT_OUT``, sorted."""
    return sorted(m for m in self.functions if not m.startswith(LEFT_OUT))

  def class_names(self) -> list[str]:
    """``module:Class`` of every class whose methods ran, sorted."""
    return sorted(f"{m}:{c}" for m, c in self.classes)

  def record(self, frame: Any, event: str, arg: Any) -> None:
    """A ``sys.setprofile`` hook: counts the memjax functions called."""
    del arg
    code = frame.f_code
    if event != "call" or not code.co_filename.startswith(PACKAGE):
      return
    module = "memjax/" + code.co_filename[len(PACKAGE) :]
    qualname = code.co_qualname
    self.functions[module][qualname] += 1
    parts = qualname.split(".")
    if len(parts) > 1 and parts[1] != "<locals>":  # Class.method
      self.classes[(module, parts[0])] += 1

  def trace_lines(self, frame: Any, event: str, arg: Any) -> Any:
    """A ``sys.settrace`` hook: records the memjax lines that run."""
    del event, arg
    filename = frame.f_code.co_filename
    if not filename.startswith(PACKAGE):
      return None
    ran = self.lines["memjax/" + filename[len(PACKAGE) :]]

    def local(frame: Any, event: str, arg: Any) -> Any:
      del arg
      if event == "line":
        ran.add(frame.f_lineno)
      return local

    return local

  def line_counts(self) -> dict[str, tuple[int, int]]:
    """{module: (lines it holds, lines that ran)} of the path's modules."""
    return {
        m: (len(source(m).splitlines()), len(self.lines.get(m, ())))
        for m in self.modules()
    }

  def function_lines(self) -> dict[str, int]:
    """{module: lines of its functions that ran}, of the path's modules.

    A function counts whole (signature, docstring, decorators, the branches
    that did not run) when any of its lines ran; one nested in another is
    inside its span, counted once.
    """
    return {
        m: lines_read(source(m), self.lines.get(m, set()))
        for m in self.modules()
    }


def source(module: str) -> str:
  """The text of ``module`` ('memjax/...py')."""
  with open(PACKAGE + module[len("memjax/") :], encoding="utf-8") as f:
    return f.read()


def lines_read(text: str, ran: set[int]) -> int:
  """The lines of the functions in ``text`` (a module's source) of which a
  line in ``ran`` ran, each function whole."""
  return sum(len(s) for s in function_spans(ast.parse(text).body) if s & ran)


def function_spans(nodes: Sequence[ast.stmt]) -> Iterator[set[int]]:
  """The line numbers of each outermost function (methods included) among
  ``nodes``, a module's or a class's body."""
  for node in nodes:
    if isinstance(node, ast.ClassDef):
      yield from function_spans(node.body)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      first = min([node.lineno] + [d.lineno for d in node.decorator_list])
      yield set(range(first, node.end_lineno + 1))


@contextlib.contextmanager
def recording(path: Path, lines: bool = False) -> Iterator[None]:
  """Records into ``path`` the memjax calls (and lines) made inside."""
  sys.setprofile(path.record)
  if lines:
    sys.settrace(path.trace_lines)
  try:
    yield
  finally:
    sys.setprofile(None)
    if lines:
      sys.settrace(None)


def trace(config: Any, workdir: str, lines: bool = False) -> Path:
  """The path from ``config`` to one lowered train step.

  Args:
    config: a run's ConfigDict.
    workdir: where the run would write (nothing is written).
    lines: also record the lines that ran.

  Returns:
    The functions and classes (and lines) that ran.
  """
  path = Path()
  with recording(path, lines):
    run = build.build(config, workdir)
  s = run.settings
  batch = plan_compile.abstract_batch(run, run.mesh)
  vocab = plan_compile.vocab_size(s)
  rng = jax.ShapeDtypeStruct(
      (2,), jnp.uint32, sharding=sharding.replicated(run.mesh)
  )
  with recording(path, lines):
    model = run.model(vocab)
    tx, _ = run.optimizer()
    loss_fn = run.objective()
    _, abstract, shardings = step_lib.abstract_state(
        model, tx, run.mesh, batch, run.state_collections()
    )
    state = checkpointing.abstract_with_sharding(abstract, shardings)
    step = step_lib.make_train_step(
        model,
        tx,
        loss_fn,
        grad_accum=int(s.train.grad_accum),
        state_shardings=shardings,
        mesh=run.mesh,
        segments_per_lane=int(s.data.segments_per_lane),
        extra_inputs=run.extra_inputs,
    )
    step.lower(state, batch, rng)
  return path


def report(path: Path, functions: bool = False) -> str:
  """The modules (with their calls, and their lines when recorded) and
  classes, as text."""
  modules = path.modules()
  counts = path.line_counts() if path.lines else {}
  read = path.function_lines() if path.lines else {}
  lines = [f"modules: {len(modules)} (besides {', '.join(LEFT_OUT)})"]
  for m in modules:
    ran = ""
    if counts:
      ran = (
          f", {counts[m][1]} of its {counts[m][0]} lines ran, in functions"
          f" of {read[m]}"
      )
    lines.append(f"  {m}  {sum(path.functions[m].values())} calls{ran}")
    if functions:
      lines.extend(f"      {f} {n}" for f, n in path.functions[m].items())
  if counts:
    held = sum(n for n, _ in counts.values())
    ran = sum(r for _, r in counts.values())
    lines.append(f"lines: {ran} ran of the {held} these modules hold")
    lines.append(f"the functions that ran hold {sum(read.values())} lines")
  names = path.class_names()
  lines.append(f"classes whose methods ran: {len(names)}")
  lines.extend(f"  {c}" for c in names)
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/trime_wt103.py:trime_7m")
  parser.add_argument("--functions", action="store_true")
  parser.add_argument("--lines", action="store_true")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  path = trace(
      harness.load_config(args.config),
      "/tmp/memjax_code_path_unused",
      lines=args.lines,
  )
  print(report(path, args.functions))
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(
          {
              "config": args.config,
              "modules": path.modules(),
              "classes": path.class_names(),
              "lines": {m: list(c) for m, c in path.line_counts().items()}
              if args.lines
              else {},
              "function_lines": path.function_lines() if args.lines else {},
          },
          f,
          indent=2,
      )


if __name__ == "__main__":
  main()
