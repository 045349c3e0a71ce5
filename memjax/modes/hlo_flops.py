"""FLOPs of an HLO module with every loop counted as often as it runs.

XLA's cost analysis (``Lowered.cost_analysis``, ``Compiled.cost_analysis``)
counts the body of a ``while`` loop once, whatever its trip count, and the
train step loops (``lax.scan``) over micro-batches, lane segments, scanned
layers, adaptive-softmax chunks and memory blocks. Unrolling every scan
before counting (what ``--mode=plan`` once did) makes a program that takes
the TPU compiler longer than a plan can wait, so this module reads the
module's text instead and counts each loop body times its trip count.

Why our own counter: XLA exposes its per-instruction costs to C++ only;
from Python there is the module total, loops once. The counter follows
XLA's ``HloCostAnalysis`` conventions (``xla/service/hlo_cost_analysis.cc``)
so that its count of a loop-free module is XLA's:

* ``dot``: 2 x output elements x the contracted elements;
* ``convolution``: 2 x output batch and features x the kernel's input
  features x the (output, window) position pairs that read an input
  element (the TPU compiler writes batched matrix products as convolutions
  dilated so that one window position in eight reads an element);
* elementwise arithmetic, compare, select, clamp: one per output element;
  transcendentals (exp, log, tanh, rsqrt, ...) count as transcendentals,
  not FLOPs;
* ``reduce``, ``reduce-window``, ``scatter``, ``select-and-scatter``,
  ``map``, ``sort``: the applied computation's FLOPs per application (a
  window as long as its dimension, the TPU compiler's form of a reduction
  broadcast back, is counted as that reduction);
* ``fusion``, ``call``, ``async`` wrappers: their computation; a
  ``conditional``: its costliest branch;
* ``while``: (condition + body) x the trip count, read from XLA's
  ``known_trip_count`` annotation of a compiled module, else from the
  condition's ``counter < constant`` test, which is how ``lax.scan``
  lowers (a loop whose count cannot be read counts once and is reported).

The trip count is the only thing added to XLA's rules, and it is checked:
``tests/modes/test_hlo_flops.py`` compares the count with XLA's on
loop-free and unrolled programs.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional

import numpy as np

_COMMENT = re.compile(r"/\*.*?\*/")
_ARRAY = re.compile(r"([a-z]+[0-9]*|pred)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*(->.*)?\{\s*$")
_CALLS = re.compile(
    r"\b(calls|to_apply|body|condition|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)"
)
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')

# XLA's HloCostAnalysis::HandleElementwiseOp: these count as transcendentals.
TRANSCENDENTAL = frozenset(
    (
        "erf",
        "exponential",
        "log",
        "logistic",
        "power",
        "sqrt",
        "cbrt",
        "rsqrt",
        "tanh",
        "sine",
        "cosine",
        "exponential-minus-one",
        "log-plus-one",
        "atan2",
        "tan",
    )
)
# Elementwise opcodes counted one FLOP per output element.
ELEMENTWISE = frozenset(
    (
        "add",
        "subtract",
        "multiply",
        "divide",
        "remainder",
        "maximum",
        "minimum",
        "negate",
        "abs",
        "sign",
        "compare",
        "select",
        "clamp",
        "and",
        "or",
        "xor",
        "not",
        "floor",
        "ceil",
        "round-nearest-afz",
        "round-nearest-even",
        "shift-left",
        "shift-right-arithmetic",
        "shift-right-logical",
        "is-finite",
        "real",
        "imag",
        "complex",
        "popcnt",
        "count-leading-zeros",
        "stochastic-convert",
        "convert",
    )
)
# Instructions that apply a computation once per reduced element.
_APPLYING = frozenset(
    ("reduce", "reduce-window", "scatter", "select-and-scatter", "map", "sort")
)


@dataclasses.dataclass
class Instruction:
  """One HLO instruction.

  Attributes:
    name: its name, without '%'.
    shapes: the result's arrays as dimension tuples (several for a tuple).
    opcode: e.g. 'dot', 'fusion', 'while'.
    operands: the operands' names.
    attributes: the text after the operand list.
  """

  name: str
  shapes: list[tuple[int, ...]]
  opcode: str
  operands: list[str]
  attributes: str


def _closing(text: str, start: int) -> int:
  """Index of the parenthesis closing the one at ``text[start]``."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] == "(":
      depth += 1
    elif text[i] == ")":
      depth -= 1
      if depth == 0:
        return i
  raise ValueError(f"unbalanced parentheses in HLO line: {text[:200]}")


def _split_top(text: str) -> list[str]:
  """``text`` split at the commas outside brackets and braces."""
  parts, depth, begin = [], 0, 0
  for i, ch in enumerate(text):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      parts.append(text[begin:i])
      begin = i + 1
  parts.append(text[begin:])
  return [p.strip() for p in parts if p.strip()]


def _shapes(text: str) -> list[tuple[int, ...]]:
  """The array dimensions named in a shape's text (a tuple has several)."""
  return [
      tuple(int(d) for d in dims.split(",") if d)
      for _, dims in _ARRAY.findall(text)
  ]


def parse_instruction(line: str) -> Optional[Instruction]:
  """An ``Instruction`` from one line of a computation, or None."""
  line = line.strip()
  if line.startswith("ROOT "):
    line = line[5:]
  if " = " not in line:
    return None
  name, rest = line.split(" = ", 1)
  if rest.startswith("("):
    end = _closing(rest, 0)
    shape_text, rest = rest[: end + 1], rest[end + 1 :].lstrip()
  else:
    shape_text, _, rest = rest.partition(" ")
  open_at = rest.find("(")
  if open_at < 0:
    return None
  opcode = rest[:open_at].strip()
  close_at = _closing(rest, open_at)
  operands = [
      p.split()[-1].lstrip("%")
      for p in _split_top(rest[open_at + 1 : close_at])
  ]
  return Instruction(
      name.strip().lstrip("%"),
      _shapes(shape_text),
      opcode,
      operands,
      rest[close_at + 1 :],
  )


def parse_module(text: str) -> tuple[dict[str, list[Instruction]], str]:
  """(computations by name, the entry computation's name) of a module's
  text (``Lowered.as_text(dialect='hlo')`` or ``Compiled.as_text()``)."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = "", None
  for raw in _COMMENT.sub("", text).splitlines():
    if current is None:
      match = _HEADER.match(raw.strip())
      if match and not raw.startswith("HloModule"):
        current = match.group(2)
        computations[current] = []
        if match.group(1):
          entry = current
      continue
    if raw.strip() == "}":
      current = None
      continue
    instruction = parse_instruction(raw)
    if instruction is not None:
      computations[current].append(instruction)
  if not entry:
    raise ValueError("the HLO text has no ENTRY computation")
  return computations, entry


def _elements(shape: tuple[int, ...]) -> int:
  return int(np.prod(shape, dtype=np.int64))


def _dims(attributes: str, key: str) -> list[int]:
  match = re.search(key + r"=\{([0-9,]*)\}", attributes)
  return [int(d) for d in match.group(1).split(",") if d] if match else []


def _called(attributes: str) -> dict[str, list[str]]:
  """The computations an instruction names, by attribute."""
  out = {}
  for key, value in _CALLS.findall(attributes):
    out[key] = [v.strip().lstrip("%") for v in value.strip("{}").split(",")]
  return out


class Counter:
  """FLOPs of the computations of one module, loops times their trips.

  Attributes:
    computations: the module's computations by name.
    entry: the entry computation's name.
    uncounted_loops: loops whose trip count could not be read (counted
      once).
  """

  def __init__(self, text: str):
    self.computations, self.entry = parse_module(text)
    self.uncounted_loops: list[str] = []
    self._shape: dict[str, dict[str, tuple[int, ...]]] = {
        name: {i.name: (i.shapes[0] if i.shapes else ()) for i in body}
        for name, body in self.computations.items()
    }

  def total(self, trips: bool = True) -> float:
    """FLOPs of the entry computation; ``trips`` False counts every loop
    body once, as XLA's cost analysis does."""
    return self.flops(self.entry, trips)

  @functools.lru_cache(maxsize=None)
  def flops(self, computation: str, trips: bool = True) -> float:
    """FLOPs of one run of ``computation``."""
    return float(
        sum(
            self._instruction(computation, i, trips)
            for i in self.computations[computation]
        )
    )

  def trip_count(self, instruction: Instruction) -> Optional[int]:
    """Iterations of a ``while``: XLA's annotation, else the bound of the
    condition's ``counter < constant`` (how ``lax.scan`` lowers)."""
    match = _TRIP.search(instruction.attributes)
    if match:
      return int(match.group(1))
    condition = _called(instruction.attributes).get("condition", [""])[0]
    body = self.computations.get(condition, [])
    constants = {}
    for i in body:
      if i.opcode == "constant" and not i.shapes[0]:
        value = re.match(r"\s*(-?\d+)\s*$", i.operands[0] if i.operands else "")
        if value:
          constants[i.name] = int(value.group(1))
    for i in body:
      if i.opcode == "compare" and "direction=LT" in i.attributes:
        if len(i.operands) == 2 and i.operands[1] in constants:
          return constants[i.operands[1]]
    return None

  def _instruction(
      self, computation: str, i: Instruction, trips: bool
  ) -> float:
    """FLOPs of one instruction (XLA's rules; see the module doc)."""
    op, shapes = i.opcode, self._shape[computation]
    out = _elements(i.shapes[0]) if i.shapes else 0
    if op == "dot":
      lhs = shapes.get(i.operands[0], ())
      contracted = _elements(
          tuple(lhs[d] for d in _dims(i.attributes, "lhs_contracting_dims"))
      )
      return 2.0 * out * contracted
    if op == "convolution":
      return self._convolution(computation, i, out)
    if op in ELEMENTWISE:
      return float(out)
    called = _called(i.attributes)
    if op == "while":
      inner = sum(
          self.flops(c, trips) for c in called["body"] + called["condition"]
      )
      count = self.trip_count(i) if trips else 1
      if count is None:
        self.uncounted_loops.append(i.name)
        count = 1
      return inner * count
    if op == "conditional":
      branches = called.get("branch_computations", [])
      branches += [
          c
          for key in ("true_computation", "false_computation")
          for c in re.findall(key + r"=%?([\w.\-]+)", i.attributes)
      ]
      return max((self.flops(c, trips) for c in branches), default=0.0)
    if op in _APPLYING:
      return self._applying(computation, i, out, called, trips)
    inner = called.get("calls", []) + called.get("to_apply", [])
    return sum(self.flops(c, trips) for c in inner)

  def _applying(
      self, computation: str, i: Instruction, out: int, called, trips: bool
  ) -> float:
    """FLOPs of reduce-like instructions: applications x the function's."""
    function = sum(self.flops(c, trips) for c in called.get("to_apply", []))
    shapes = self._shape[computation]
    if i.opcode == "reduce":
      # XLA: applications = the first operand's elements - the first
      # result's (the function already does the work of every operand).
      count = _elements(shapes.get(i.operands[0], ()))
      return function * max(count - _elements(i.shapes[0]), 0)
    if i.opcode == "scatter":
      updates = i.operands[len(i.operands) // 2 + 1 :] or i.operands[-1:]
      return function * sum(_elements(shapes.get(u, ())) for u in updates)
    if i.opcode == "reduce-window":
      return function * self._window_applications(computation, i, out)
    return function * out

  def _window_applications(
      self, computation: str, i: Instruction, out: int
  ) -> float:
    """Applications of a ``reduce-window``'s function: XLA's (window - 1)
    per output element, except for a window as long as its dimension. The
    TPU compiler writes a reduction broadcast back over its dimension (the
    row maximum of a softmax, subtracted from every element) as such a
    window, padded to twice the row: read as XLA's rule it would cost a
    row's length per element, quadratic in the row; it is that reduction,
    one application per input element."""
    sizes = re.search(r"size=([0-9x]+)", i.attributes)
    window = [int(x) for x in sizes.group(1).split("x")] if sizes else [1]
    lhs = self._shape[computation].get(i.operands[0], ())
    if lhs and len(lhs) == len(window):
      if any(w > 1 and w >= n for w, n in zip(window, lhs)):
        return float(_elements(lhs))
    return float(out * max(_elements(tuple(window)) - 1, 0))

  def _convolution(self, computation: str, i: Instruction, out: int) -> float:
    """XLA's ``GetConvolutionFlops``: 2 x the output's batch and features x
    the kernel's input features x, per spatial dimension, the (output,
    window) position pairs that land on an input element (not on padding
    or a hole of ``lhs_dilate``). The TPU compiler writes batched matrix
    products as such dilated convolutions."""
    shapes = self._shape[computation]
    lhs, kernel = (shapes.get(x, ()) for x in i.operands[:2])
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", i.attributes)
    if not labels or not kernel or not lhs:
      return 2.0 * out * _elements(kernel)
    in_labels, kernel_labels, out_labels = labels.groups()
    window = re.search(r"window=\{([^}]*)\}", i.attributes)
    fields = dict(
        f.split("=", 1) for f in (window.group(1).split() if window else [])
    )
    spatial = [d for d in out_labels if d.isdigit()]

    def per_dim(key: str, default: int) -> list[int]:
      if key not in fields:
        return [default] * len(spatial)
      return [int(v) for v in fields[key].split("x")]

    size, stride = per_dim("size", 1), per_dim("stride", 1)
    lhs_dilate, rhs_dilate = per_dim("lhs_dilate", 1), per_dim("rhs_dilate", 1)
    pads = fields.get("pad", "").split("x") if "pad" in fields else []
    pad_low = [int(p.split("_")[0]) for p in pads] or [0] * len(spatial)
    pairs = 1
    for k, d in enumerate(spatial):
      n_in = lhs[in_labels.index(d)]
      n_out = i.shapes[0][out_labels.index(d)]
      limit = (n_in - 1) * lhs_dilate[k]
      count = 0
      for o in range(n_out):
        for w in range(size[k]):
          pos = o * stride[k] + w * rhs_dilate[k] - pad_low[k]
          count += 0 <= pos <= limit and pos % lhs_dilate[k] == 0
      pairs *= count
    outer = out // max(
        _elements(tuple(i.shapes[0][out_labels.index(d)] for d in spatial)), 1
    )
    return 2.0 * outer * kernel[kernel_labels.index("i")] * pairs


def module_flops(text: str, trips: bool = True) -> float:
  """FLOPs of an HLO module's text, each loop body times its trip count
  (``trips`` False: once, as XLA counts)."""
  return Counter(text).total(trips)


def known_trip_counts(text: str) -> list[int]:
  """The trip counts XLA annotated on a compiled module's loops."""
  return [int(n) for n in _TRIP.findall(text)]
