"""``benchmarks/code_path.py``: the modules and classes from a config to one
lowered train step, counted, and held at today's numbers so the path a
maintainer follows does not grow back unnoticed."""

import ast
import inspect
import os
import sys

from benchmarks import code_path
from configs import trime_wt103
from memjax.models import stack

# The path of configs/trime_wt103.py:trime_7m (docs/design.md lists it).
# Lower these when the path shrinks; a change that lengthens it says why.
MAX_MODULES = 23
MAX_CLASSES = 18
# The lines of the functions that ran on it: what a reader following the
# calls reads (3,209 today).
MAX_FUNCTION_LINES = 3_250


def test_the_path_of_trime_7m_stays_short(tmp_path):
  workdir = str(tmp_path / "run")
  path = code_path.trace(
      trime_wt103.get_config("trime_7m"), workdir, lines=True
  )
  modules, classes = path.modules(), path.class_names()
  report = code_path.report(path)
  assert len(modules) <= MAX_MODULES, report
  assert len(classes) <= MAX_CLASSES, report
  assert sum(path.function_lines().values()) <= MAX_FUNCTION_LINES, report
  # The steps a reader follows are all on it: the run built, the model's
  # attention core, TRIME's loss, the train step; storage is left out.
  for module in (
      "memjax/build.py",
      "memjax/models/multihead.py",
      "memjax/methods/trime/in_batch.py",
      "memjax/run/step.py",
  ):
    assert module in modules, report
  assert not [m for m in modules if m.startswith(code_path.LEFT_OUT)]
  assert "memjax/models/transformer.py:TransformerLM" in classes
  assert not os.path.exists(workdir)  # Building a run writes nothing.


def test_a_call_is_counted_under_its_module_and_class():
  path = code_path.Path()
  sys.setprofile(path.record)
  try:
    stack.unroll_factor(3)
    _ = stack.LayerRun("layer", 0, 2, True).name
  finally:
    sys.setprofile(None)
  assert path.functions["memjax/models/stack.py"] == {
      "unroll_factor": 1,
      "LayerRun.name": 1,
  }
  assert path.class_names() == ["memjax/models/stack.py:LayerRun"]
  assert path.modules() == ["memjax/models/stack.py"]


def test_the_lines_that_ran_are_counted_against_the_lines_held():
  path = code_path.Path()
  with code_path.recording(path, lines=True):
    stack.unroll_factor(3)
  # unroll_factor's one statement is its return (the docstring is no line).
  source, first = inspect.getsourcelines(stack.unroll_factor)
  returns = [first + i for i, t in enumerate(source) if "return" in t]
  assert path.lines == {"memjax/models/stack.py": set(returns)}
  with open(inspect.getsourcefile(stack), encoding="utf-8") as f:
    held = len(f.readlines())
  assert path.line_counts() == {"memjax/models/stack.py": (held, 1)}
  # The function is read whole: its signature and docstring too.
  assert path.function_lines() == {"memjax/models/stack.py": len(source)}
  assert "1 of its" in code_path.report(path)


def test_a_function_is_read_whole_once_with_its_nested_functions():
  # A hand-worked module: the method and the nested function ran, the
  # decorated function and the class's other method did not.
  source = (
      "class A:\n"  # 1
      "  def ran(self):\n"  # 2
      "    def inner():\n"  # 3
      "      return 1\n"  # 4
      "    return inner()\n"  # 5
      "  def idle(self):\n"  # 6
      "    return 2\n"  # 7
      "@staticmethod\n"  # 8
      "def decorated():\n"  # 9
      "  return 3\n"  # 10
  )
  spans = list(code_path.function_spans(ast.parse(source).body))
  assert spans == [{2, 3, 4, 5}, {6, 7}, {8, 9, 10}]
  assert code_path.lines_read(source, {4, 5}) == 4
  assert code_path.lines_read(source, {7, 10}) == 5
  assert code_path.lines_read(source, set()) == 0
