"""The external-memory demo's rows and tables (no flags, no training).

The two models (``MODELS``: vanilla, scored as a kNN-LM, and TRIMELM_ext),
the ablations of Tables 11 and 15 (``ABLATIONS``), the evaluations with the
local memory only that pair a baseline with its match (``tune_local``), and
the markdown of Table 2's, Table 5's and the ablations' layouts.
``memjax/demos/external.py`` trains and scores; this module can be tested by
itself.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping

from memjax.demos import common

# The two models: variant METHOD_SIZE of configs/trime_wt103.py; "kind":
# the external memory each is scored with.
MODELS = (
    common.Row(
        "vanilla", "vanilla", "trime_wt103", "vanilla", options={"kind": "knn"}
    ),
    common.Row(
        "trime_ext",
        "TRIMELM_ext",
        "trime_wt103",
        "trime_ext",
        options={"kind": "trime_ext"},
    ),
)

# Tables 11 and 15: TRIMELM_ext with config overrides (dotted keys).
ABLATIONS = tuple(
    common.Row(
        key,
        label,
        "trime_wt103",
        "trime_ext",
        options={"kind": "trime_ext", "overrides": overrides},
    )
    for label, key, overrides in (
        (
            "random batches (Table 11)",
            "random_batches",
            {"data.batching": "random"},
        ),
        (
            "no gradient into the memory (Table 11)",
            "stop_gradient_memory",
            {"trime.stop_gradient_memory": True},
        ),
        ("p = 0 (Table 15)", "hide_p0", {"trime.local_hide_prob": 0.0}),
        ("p = 0.5 (Table 15)", "hide_p05", {"trime.local_hide_prob": 0.5}),
    )
)


def format_ablations(main: list[dict], ablations: list[dict]) -> str:
  """Markdown, Tables 11 and 15: valid perplexity of TRIMELM_ext variants."""
  rows = [dict(m, row="BM25 batches, gradients, p = 0.9") for m in main]
  body = [
      [
          m["row"],
          em_setting(m["scann"]["best"]),
          f"{m['scann']['valid']['plain']['ppl']:.2f}",
          f"{m['scann']['valid']['memory']['ppl']:.2f}",
      ]
      for m in rows + ablations
  ]
  head = [
      "TRIMELM_ext trained with",
      "setting (tuned on valid)",
      "valid ppl without memory",
      "valid ppl, M_local u M_long u M_ext",
  ]
  return common.markdown(head, "llrr", body)


def _memory_cells(r: dict) -> list[str]:
  """The setting, valid and test cells of a tuned evaluation memory."""
  return [
      em_setting(r["best"]),
      f"{r['valid']['memory']['ppl']:.2f}",
      f"{r['test']['memory']['ppl']:.2f}",
  ]


def format_domain_table(models: list[dict]) -> str:
  """Markdown, Table 5's layout: iwslt_en perplexity per datastore."""
  body = []
  for m in models:
    d, name = m["domain"], {"vanilla": "vanilla"}.get(
        m["method"], "TRIMELM_ext"
    )
    plain = d["wiki"]
    body.append(
        [
            name,
            "-",
            "-",
            "-",
            f"{plain['valid']['plain']['ppl']:.2f}",
            f"{plain['test']['plain']['ppl']:.2f}",
        ]
    )
    mem = "M_ext" if m["kind"] == "knn" else "M_local u M_long u M_ext"
    for what, store, r in (
        ("M_local u M_long", "-", d.get("local_long")),
        (mem, "Wikipedia train", d["wiki"]),
        (mem, "iwslt_en train", d["own"]),
    ):
      if r:
        body.append([name, what, store, *_memory_cells(r)])
  head = [
      "model",
      "memory at evaluation",
      "datastore",
      "setting (tuned on iwslt_en valid)",
      "valid ppl",
      "test ppl",
  ]
  return common.markdown(head, "llllrr", body)


def format_table(models: list[dict]) -> str:
  """Markdown: one row per evaluation, Table 2's order; the kNN-LM + cache
  row and TRIMELM_ext without M_long read the same memories (M_local and
  M_ext)."""
  by = {m["method"]: m for m in models}
  van, ext = by.get("vanilla"), by.get("trime_ext")
  body = [
      [
          name,
          "-",
          "-",
          f"{m['scann']['valid']['plain']['ppl']:.2f}",
          f"{m['scann']['test']['plain']['ppl']:.2f}",
          "-",
          "-",
      ]
      for name, m in (("vanilla", van), ("TRIMELM_ext", ext))
      if m
  ]

  def row(name, mem, r, m=None):
    exact = (
        [f"{m['exact']['test']['ppl']:.2f}", f"{m['recall']['recall']:.3f}"]
        if m
        else ["-", "-"]
    )
    setting, valid, test = _memory_cells(r)
    return [name, mem, setting, valid, test, *exact]

  if van:
    body.append(row("vanilla + kNN-LM", "M_ext", van["scann"], van))
    body.append(
        row(
            "vanilla + kNN-LM + continuous cache",
            "M_local; M_ext",
            van["without_long"],
        )
    )
  if ext:
    body.append(row("TRIMELM_ext", "M_local u M_long", ext["local_long"]))
    body.append(
        row(
            "TRIMELM_ext without M_long", "M_local u M_ext", ext["without_long"]
        )
    )
    body.append(
        row("TRIMELM_ext", "M_local u M_long u M_ext", ext["scann"], ext)
    )
  head = [
      "model",
      "memory at evaluation",
      "setting (tuned on valid)",
      "valid ppl",
      "test ppl",
      "test ppl, exact search",
      "ScaNN recall@K",
  ]
  return common.markdown(head, "lllrrrr", body)


def em_setting(best: dict) -> str:
  # pylint: disable=g-import-not-at-top
  from memjax import build
  from memjax.eval import grid as grid_lib

  words = grid_lib.setting_str(best, build.parts().eval_memories)
  return words.replace("long_mem_tokens", "N")


# The evaluations with the local memory only (N = 0) that pair a baseline
# with its match, per model: (the evaluation memory, the stage). Table 2's
# "kNN-LM + continuous cache" is the cache over M_local on top of kNN-LM;
# "TRIMELM_ext w/o M_long" reads M_local u M_ext, the same memories, which
# is why §5.1 calls it the fair comparison.
LOCAL_ONLY = {
    "vanilla": ("knn_cache", "tune_knn_cache_local"),
    "trime_ext": ("trime_ext", "tune_trime_ext_local"),
}


# The sections a memory's evaluation reads: the engine's and the kinds'.
MEMORY_SECTIONS = ("eval_memory", "trime", "cache", "external")


def memory_settings(c: Any) -> dict[str, Any]:
  """{section: its keys} of the sections an evaluation memory reads in the
  config ``c`` (what a stage's name digests)."""
  return {name: c[name].to_dict() for name in MEMORY_SECTIONS}


def stage_name(stage: str, settings: Mapping[str, Any]) -> str:
  """``<stage>_<digest>``: the name a tuning stage is kept under, with the
  first 10 hex digits of the SHA-1 of its evaluation-memory ``settings``
  (as JSON, keys sorted), so a stage kept by a run with other settings (an
  earlier grid, another memory size) is run again, not read back."""
  text = json.dumps(common.jsonable(settings), sort_keys=True)
  return f"{stage}_{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def tune_local(c: Any, method: str, tune: Callable[[str], dict]) -> dict:
  """The model ``method``'s memories without M_long, tuned with ScaNN.

  Args:
    c: the model's config; its ``eval_memory`` is set to ``LOCAL_ONLY``'s
      kind, ScaNN search and N = 0 for the stage, and is as before after it.
    method: ``vanilla`` or ``trime_ext``.
    tune: ``tune(stage)``, the stage that tunes ``c.eval_memory``.

  Returns:
    The tuning's results (``memory_modes.tune``'s).
  """
  kind, stage = LOCAL_ONLY[method]
  em = c.eval_memory
  before = (em.kind, em.search, em.long_mem_grid)
  em.kind, em.search, em.long_mem_grid = kind, "scann", (0,)
  print(f"== {method}: tune {kind} with N = 0 with ScaNN", flush=True)
  try:
    return tune(stage)
  finally:
    em.kind, em.search, em.long_mem_grid = before
