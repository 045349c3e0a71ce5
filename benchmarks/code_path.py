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

    python benchmarks/code_path.py --config=configs/trime_wt103.py:trime_7m \\
        [--functions] [--out=path.json]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
from typing import Any, Optional, Sequence

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
  """What ran: {module: {function: calls}} and {(module, class): calls}."""

  functions: dict[str, collections.Counter] = dataclasses.field(
      default_factory=lambda: collections.defaultdict(collections.Counter)
  )
  classes: collections.Counter = dataclasses.field(
      default_factory=collections.Counter
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


def trace(config: Any, workdir: str) -> Path:
  """The path from ``config`` to one lowered train step.

  Args:
    config: a run's ConfigDict.
    workdir: where the run would write (nothing is written).

  Returns:
    The functions and classes that ran.
  """
  path = Path()
  sys.setprofile(path.record)
  try:
    run = build.build(config, workdir)
  finally:
    sys.setprofile(None)
  s = run.settings
  batch = plan_compile.abstract_batch(run, run.mesh)
  vocab = plan_compile.vocab_size(s)
  rng = jax.ShapeDtypeStruct(
      (2,), jnp.uint32, sharding=sharding.replicated(run.mesh)
  )
  sys.setprofile(path.record)
  try:
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
  finally:
    sys.setprofile(None)
  return path


def report(path: Path, functions: bool = False) -> str:
  """The modules (with their calls) and classes, as text."""
  modules = path.modules()
  lines = [f"modules: {len(modules)} (besides {', '.join(LEFT_OUT)})"]
  for m in modules:
    lines.append(f"  {m}  {sum(path.functions[m].values())} calls")
    if functions:
      lines.extend(f"      {f} {n}" for f, n in path.functions[m].items())
  names = path.class_names()
  lines.append(f"classes whose methods ran: {len(names)}")
  lines.extend(f"  {c}" for c in names)
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/trime_wt103.py:trime_7m")
  parser.add_argument("--functions", action="store_true")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  path = trace(harness.load_config(args.config), "/tmp/memjax_code_path_unused")
  print(report(path, args.functions))
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(
          {
              "config": args.config,
              "modules": path.modules(),
              "classes": path.class_names(),
          },
          f,
          indent=2,
      )


if __name__ == "__main__":
  main()
