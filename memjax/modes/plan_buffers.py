"""The largest buffers of a compiled step, from XLA's own buffer assignment.

``--config.plan.buffers=N`` compiles each planned train step with
``xla_dump_to`` (a compiler option of that compilation alone, so it works
for the TPU compiler as for XLA:CPU; the persistent compilation cache off) and reads back what the compiler
decided: every allocation of the step (its parameters, outputs and
temporaries) and the values that live in it, with their shapes and the
instruction that made each (``*after_optimizations-buffer-assignment.txt``
and ``-buffer-assignment-values.txt``). The N largest values that are not
parameters are listed: where a bfloat16 step keeps float32 temporaries, and
which op made them. XLA writes the format; it is parsed here because JAX
exposes only the totals (``memory_analysis``).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

# 'allocation 6: size 4, preallocated-temp:'
_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+), (.*):$")
# ' value: <15 fusion.3 @0> (size=4,offset=0): f32[]'
_VALUE = re.compile(
    r"^ value: <(\d+) (\S+) @\d+> \(size=(\d+),offset=\d+\): (.+)$"
)
# ' from instruction: %fusion.3 = f32[8,16]{1,0} fusion(...), metadata={...}'
_MADE_BY = re.compile(r"^ from instruction: %(\S+) = (.*?) ([\w-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FIRST_VALUE = re.compile(r"^<(\d+) (\S+) @\d+>$")


def compile_with_dump(lowered: Any, dump_dir: str) -> Any:
  """``lowered.compile()``, the compiler dumping its buffer assignment (and
  the optimised HLO) into ``dump_dir``. A step served by the persistent
  compilation cache is not compiled and dumps nothing: the plan turns the
  cache off when it lists buffers (``platforms.set_device_flags``)."""
  return lowered.compile(compiler_options={"xla_dump_to": dump_dir})


def _kind(header: str) -> str:
  """An allocation's kind from its header's description."""
  if header.startswith("parameter"):
    return "parameter"
  if "output" in header or "live-out" in header:
    return "output"
  if "constant" in header:
    return "constant"
  return "temporary"


def _makers(text: str) -> dict[str, tuple[str, str]]:
  """{value id: (opcode, JAX op name)} of a ``-values.txt`` dump."""
  out: dict[str, tuple[str, str]] = {}
  current = None
  for line in text.splitlines():
    first = _FIRST_VALUE.match(line)
    if first:
      current = first.group(1)
      continue
    made = _MADE_BY.match(line)
    if made and current is not None:
      name = _OP_NAME.search(line)
      op_name = name.group(1).replace("\\'", "'") if name else ""
      out[current] = (made.group(3), op_name)
  return out


def parse(assignment: str, values: str = "") -> list[dict[str, Any]]:
  """Every value of a buffer assignment, largest first.

  Args:
    assignment: the text of ``*after_optimizations-buffer-assignment.txt``.
    values: the text of ``*-buffer-assignment-values.txt`` ('' = no ops).

  Values of one allocation may share its bytes at different times (the
  temporaries' buffer), so the list says what the step holds, not how much
  of it is live at once (``memory_analysis`` gives the peak).

  Returns:
    Per value: 'bytes', 'shape' (XLA's, e.g. 'bf16[8,128]{1,0}'), 'dtype'
    ('bf16'), 'kind' (parameter | output | temporary | constant), 'op' (the
    opcode that made it) and 'op_name' (JAX's name of the op, the
    traceback path of the code that made it).
  """
  makers = _makers(values)
  kind, out = "", []
  for line in assignment.splitlines():
    header = _ALLOCATION.match(line)
    if header:
      kind = _kind(header.group(3))
      continue
    value = _VALUE.match(line)
    if value:
      ident, shape = value.group(1), value.group(4).strip()
      op, op_name = makers.get(ident, ("", ""))
      out.append(
          {
              "bytes": int(value.group(3)),
              "shape": shape,
              "dtype": shape.split("[", 1)[0].lstrip("("),
              "kind": kind,
              "op": op,
              "op_name": op_name,
              "value": value.group(2),
          }
      )
  out.sort(key=lambda v: -v["bytes"])
  return out


def largest(dump_dir: str, n: int) -> list[dict[str, Any]]:
  """The ``n`` largest values, besides parameters, of the one module
  compiled into ``dump_dir`` (its largest buffer assignment when there are
  several).

  Raises:
    FileNotFoundError: the compiler wrote no buffer assignment there (the
      step came from the persistent compilation cache).
  """
  files = glob.glob(
      os.path.join(dump_dir, "*after_optimizations-buffer-assignment.txt")
  )
  if not files:
    raise FileNotFoundError(f"no buffer assignment was dumped in {dump_dir}")
  path = max(files, key=os.path.getsize)
  values_path = path.replace(
      "buffer-assignment.txt", "buffer-assignment-values.txt"
  )
  with open(path, encoding="utf-8") as f:
    assignment = f.read()
  values = ""
  if os.path.isfile(values_path):
    with open(values_path, encoding="utf-8") as f:
      values = f.read()
  found = [v for v in parse(assignment, values) if v["kind"] != "parameter"]
  return found[: int(n)]


def rows(buffers: list[dict[str, Any]], dtype: str) -> list[str]:
  """A markdown table of ``largest``'s list for the step in ``dtype``."""
  out = [
      f"Largest buffers of the {dtype} step (per device, parameters aside):",
      "",
      "| MiB | shape | kind | op | made by |",
      "| ---: | --- | --- | --- | --- |",
  ]
  for v in buffers:
    made_by = "/".join(v["op_name"].split("/")[-3:]) or "-"
    out.append(
        f"| {v['bytes'] / 2**20:.2f} | `{v['shape']}` | {v['kind']} | "
        f"{v['op'] or '-'} | `{made_by}` |"
    )
  return out
