"""The accelerator check's layout: its items, ratios, plan platforms, tables.

What ``benchmarks/accelerator_check.py`` measures (``ITEMS``, ``RATIOS``),
which ``--mode=plan`` platform a device kind is (``plan_platform``), the
plan's predictions read from its ``plan.json`` (``predictions``), and the
report: the ratios computed from the rows' own numbers (``ratios``) and the
Markdown tables (``markdown``). Pure functions of JSON-like values: nothing
here starts JAX, so the parent process of the check never holds a device.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

# An item's status: "ok", "error: <one line>", or one of these.
SKIPPED_BUDGET = "skipped: budget"
SKIPPED_UNSELECTED = "skipped: not selected"
PENDING = "pending"


@dataclasses.dataclass(frozen=True)
class Item:
  """One trained config of the check.

  Attributes:
    name: the row's name.
    config: ``path.py:variant`` on an accelerator.
    tiny: ``path.py:variant`` with ``--tiny`` (seconds on a CPU).
    batch: rows per step on one device (0: the config's own).
    tiny_overrides: ``KEY=VALUE`` overrides with ``--tiny``.
  """

  name: str
  config: str
  tiny: str
  batch: int = 0
  tiny_overrides: tuple[str, ...] = ()


# The items of a ratio side by side, the cheaper pairs first (they run in
# the order of NAMES). BERT-base's batch of 1,024 rows is cut to 32 for one
# device (--mode=plan: 1.8 GiB per row in float32).
ITEMS = (
    Item("vanilla_7m", "configs/trime_wt103.py:vanilla_7m", "vanilla_smoke"),
    Item("trime_7m", "configs/trime_wt103.py:trime_7m", "trime_smoke"),
    Item("txl_enwik8", "configs/txl_wt103.py:enwik8", "smoke"),
    Item("lamemo_enwik8", "configs/lamemo_wt103.py:enwik8", "smoke"),
    Item("bert_base", "configs/pkm_bert.py:vanilla_base", "vanilla_smoke", 32),
    Item("pkm_base", "configs/pkm_bert.py:pkm_base", "pkm_smoke", 32),
    Item(
        "vanilla_150m",
        "configs/trime_wt103.py:vanilla_150m",
        "vanilla_smoke",
        tiny_overrides=("data.seq_len=16",),
    ),
    Item(
        "trime_150m",
        "configs/trime_wt103.py:trime_150m",
        "trime_smoke",
        tiny_overrides=("data.seq_len=16",),
    ),
)
KNN = "knn"
# The order the items run in (and their rows): the kNN search before the
# 150M pair, the slowest to compile.
NAMES = (
    tuple(i.name for i in ITEMS[:6]) + (KNN,) + (ITEMS[6].name, ITEMS[7].name)
)


def tiny_config(item: Item) -> str:
  """The item's ``--tiny`` config: its file with the tiny variant."""
  return f"{item.config.split(':')[0]}:{item.tiny}"


@dataclasses.dataclass(frozen=True)
class Ratio:
  """A method's row against its baseline's.

  Attributes:
    name: the ratio's name.
    of: the method's row.
    over: the baseline's row.
    claim: what the paper reports.
    flops: also the ratio of XLA's FLOPs per step.
  """

  name: str
  of: str
  over: str
  claim: str
  flops: bool = False


RATIOS = (
    Ratio(
        "trime_vs_vanilla_7m",
        "trime_7m",
        "vanilla_7m",
        "TRIME: trains at the vanilla LM's speed (step time 1.0x)",
    ),
    Ratio(
        "trime_vs_vanilla_150m",
        "trime_150m",
        "vanilla_150m",
        "TRIME: trains at the vanilla LM's speed (step time 1.0x)",
    ),
    Ratio(
        "lamemo_vs_txl_enwik8",
        "lamemo_enwik8",
        "txl_enwik8",
        "LaMemo: 1.22x the FLOPs of Transformer-XL",
        flops=True,
    ),
    Ratio(
        "pkm_vs_base",
        "pkm_base",
        "bert_base",
        "Kim & Jung: BERT-base + PKM at 0.77x the batches/s (step time 1.30x)",
    ),
)

# JAX's device kinds ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "TPU v5 lite",
# "TPU v5" for v5p, "cpu") -> the --mode=plan platform; first match wins.
_KINDS = (
    (r"\bH200\b", "h200"),
    (r"\bH100\b", "h100"),
    (r"\bA100\b", "a100"),
    (r"^TPU v4\b", "tpu_v4"),
    (r"^TPU v5 ?(lite|e)\b", "tpu_v5e"),
    (r"^TPU v5p?$", "tpu_v5p"),
    (r"^cpu$", "cpu"),
)


def plan_platform(device_kind: str) -> str | None:
  """The ``plan.platform`` of a JAX device kind, None for an unknown one."""
  kind = device_kind.strip()
  for pattern, name in _KINDS:
    if re.search(pattern, kind, re.IGNORECASE):
      return name
  return None


def no_platform(device_kind: str) -> str:
  """The plan column of a device kind without a platform entry."""
  return f"n/a: no platform entry for {device_kind}"


def peak_flops(platform: str, dtype: str) -> float:
  """The platform's peak FLOP/s for ``dtype`` (memjax/modes/platforms.py)."""
  # Imported here: memjax needs ml_collections, which the check looks for
  # first, to say in one line how to bring it.
  from memjax.modes import platforms  # pylint: disable=g-import-not-at-top

  p = platforms.get(platform)
  return p.peak_bf16 if dtype == "bfloat16" else p.peak_fp32


def predictions(plan: Mapping[str, Any], dtype: str) -> dict[str, Any]:
  """The figures of a ``plan.json`` beside which the measured ones go.

  Args:
    plan: the plan's results (``memjax.modes.plan.plan``).
    dtype: the planned ``model.dtype`` to read.
  """
  r = plan["dtypes"][dtype]
  formula = plan["formula_flops_per_token"]["model"]
  peak = peak_flops(plan["platform"], dtype)
  return {
      "status": "ok",
      "platform": plan["platform"],
      "estimate": bool(plan["estimate"]),
      "tokens_per_step": int(plan["tokens_per_step"]),
      "compile_s": float(r["memory"]["seconds"]),
      "step_s": float(r["step_time_s"]),
      "tokens_per_s": float(r["tokens_per_s"]),
      "memory_bytes": int(r["memory"]["total"]),
      "fits": bool(r["fits"]),
      "xla_flops_per_token": float(plan["flops_per_token"]),
      "model_flops_per_token": float(formula),
      "mfu": float(formula) * float(r["tokens_per_s"]) / peak,
      "utilization": float(plan["utilization"]),
  }


def measured_mfu(measured: Mapping[str, Any], platform: str | None) -> Any:
  """Model FLOPs per token x tokens/s over the platform's peak, or why not."""
  if platform is None:
    return "n/a: no platform entry"
  fpt, tps = measured.get("model_flops_per_token"), measured.get("tokens_per_s")
  if not isinstance(fpt, (int, float)) or not isinstance(tps, (int, float)):
    return "n/a: no FLOPs or tokens/s"
  return fpt * tps / peak_flops(platform, measured["dtype"])


def _number(row: Mapping[str, Any], key: str) -> float | None:
  value = row.get("measured", {}).get(key)
  return float(value) if isinstance(value, (int, float)) else None


def ratio(spec: Ratio, rows: Mapping[str, Mapping[str, Any]]) -> dict:
  """``spec``'s ratios from its two rows' own measurements (method over
  baseline; a string saying why where either is missing)."""
  of, over = rows.get(spec.of, {}), rows.get(spec.over, {})
  out: dict[str, Any] = {
      "name": spec.name,
      "of": spec.of,
      "over": spec.over,
      "claim": spec.claim,
  }
  keys = ["step_s"] + (
      ["xla_flops_per_step", "cost_analysis_flops_per_step"]
      if spec.flops
      else []
  )
  tokens = [_number(r, "tokens_per_step") for r in (of, over)]
  for key in keys:
    a, b = _number(of, key), _number(over, key)
    name = "step_time_ratio" if key == "step_s" else key[: -len("_per_step")]
    if key != "step_s":
      name += "_ratio"
    if a is None or not b:
      missing = spec.of if a is None else spec.over
      out[name] = f"n/a: {missing} has no {key}"
    elif tokens[0] != tokens[1]:
      out[name] = (
          f"n/a: batches differ ({tokens[0]:.0f} vs {tokens[1]:.0f} tokens)"
      )
    else:
      out[name] = a / b
  return out


def ratios(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """Every ``RATIOS`` entry computed from ``rows``."""
  by_name = {r["name"]: r for r in rows}
  return [ratio(spec, by_name) for spec in RATIOS]


# Markdown.

GIB = 2.0**30


def _fmt(value: Any, scale: float = 1.0) -> str:
  """A number to 3-4 significant digits, '-' for None, a string as is
  (shortened to its head: 'n/a: ...' becomes 'n/a')."""
  if value is None:
    return "-"
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return str(value).split(":")[0]
  return f"{value / scale:.4g}"


def _pair(row: Mapping[str, Any], key: str, plan_key: str, scale=1.0) -> str:
  """'measured / predicted' of one cell."""
  measured = row.get("measured", {}).get(key)
  plan = row.get("plan", {})
  predicted = plan.get(plan_key) if plan.get("status") == "ok" else "n/a"
  return f"{_fmt(measured, scale)} / {_fmt(predicted, scale)}"


def _status(row: Mapping[str, Any]) -> str:
  """The row's status, and its plan's when that is not ok."""
  status = str(row.get("status", PENDING)).replace("|", "/")
  plan = row.get("plan", {}).get("status", "")
  if plan and plan != "ok" and not status.startswith("skipped"):
    status += f"; plan {plan}".replace("|", "/")
  return status


def train_rows(rows: Sequence[Mapping[str, Any]]) -> list[str]:
  """The table of the trained configs: measured / predicted per cell."""
  out = [
      "| item | config | batch x length | status | compile s | step s | "
      "tokens/s | peak GiB | MFU |",
      "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
  ]
  for r in rows:
    m = r.get("measured", {})
    # As measured (halved where it did not fit), else as planned.
    shape = r.get("shape", "-")
    if "batch_size" in m:
      shape = f"{m['batch_size']} x {m['seq_len']}"
    out.append(
        f"| {r['name']} | `{r['config']}` | {shape} | {_status(r)} | "
        f"{_pair(r, 'compile_s', 'compile_s')} | "
        f"{_pair(r, 'step_s', 'step_s')} | "
        f"{_pair(r, 'tokens_per_s', 'tokens_per_s')} | "
        f"{_pair(r, 'peak_bytes', 'memory_bytes', GIB)} | "
        f"{_pair(r, 'mfu', 'mfu')} |"
    )
  return out


def knn_rows(row: Mapping[str, Any]) -> list[str]:
  """The kNN search's table: exact search on the device, ScaNN on the host."""
  m = row.get("measured", {})
  shape = f"{m['keys']} x {m['dim']}" if "keys" in m else "-"
  scann = m.get("scann", "-")
  return [
      "| item | keys x dim | k | queries | status | exact queries/s "
      "(device) | ScaNN queries/s (host) | ScaNN recall@k |",
      "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
      f"| {row['name']} | {shape} | {m.get('k', '-')} | "
      f"{m.get('queries', '-')} | {_status(row)} | "
      f"{_fmt(m.get('exact_queries_per_s'))} | "
      f"{_fmt(m.get('scann_queries_per_s', scann))} | "
      f"{_fmt(m.get('recall_at_k', scann))} |",
  ]


def ratio_rows(computed: Sequence[Mapping[str, Any]]) -> list[str]:
  """The ratios' table."""
  out = [
      "| ratio | step time | XLA FLOPs (trip counts) | XLA cost analysis "
      "(loops once) | paper |",
      "| --- | ---: | ---: | ---: | --- |",
  ]
  for r in computed:
    out.append(
        f"| {r['name']} ({r['of']} / {r['over']}) | "
        f"{_fmt(r['step_time_ratio'])} | {_fmt(r.get('xla_flops_ratio'))} | "
        f"{_fmt(r.get('cost_analysis_flops_ratio'))} | {r['claim']} |"
    )
  return out


def machine_line(report: Mapping[str, Any]) -> str:
  """One line on the machine, the plan's platform and the budget."""
  m = report.get("machine", {})
  if "device_kind" in m:
    where = (
        f"{m['device_count']}x {m['device_kind']} ({m['platform']}; "
        f"measured on one device), jax {m.get('jax')}, jaxlib "
        f"{m.get('jaxlib')}, flax {m.get('flax')}, Python {m.get('python')}"
    )
  else:
    where = f"machine {m.get('status', 'unknown')}"
  return (
      f"{where}. Plan platform: {report.get('plan_platform')}. Budget "
      f"{report['budget_s']:.0f} s, took {report.get('elapsed_s', 0):.0f} s."
  )


def markdown(report: Mapping[str, Any]) -> str:
  """The report as Markdown: the machine, then one table row per item."""
  rows = report["rows"]
  train = [r for r in rows if r.get("kind") == "train"]
  knn = [r for r in rows if r.get("kind") == "knn"]
  lines = [
      "# Accelerator check",
      "",
      machine_line(report),
      "",
      "Each cell: measured / predicted by `--mode=plan` for one device of "
      "the plan platform at the same batch (peak GiB: the device's peak "
      "bytes in use / the plan's memory per device; MFU: model FLOPs per "
      "token x tokens/s over the platform's peak).",
      "",
      *train_rows(train),
  ]
  for row in knn:
    lines += ["", "## kNN search", "", *knn_rows(row)]
  lines += ["", "## Ratios (method / baseline)", ""]
  lines += ratio_rows(report.get("ratios", []))
  return "\n".join(lines) + "\n"
