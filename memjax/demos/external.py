"""The external-memory demo: kNN-LM and TRIMELM_ext on the demo corpus.

    python -m memjax.demos.external --workdir=runs/extmem_demo   # make demo-ext

Two models train with the TRIME demo's steps, model and batch
(``configs/trime_wt103.py``, size ``demo``):

* vanilla: the plain LM objective; evaluated without memory, with
  kNN-LM (``knn``: squared L2, lambda and temperature tuned on valid) and
  with kNN-LM plus a continuous cache over M_local u M_long
  (``knn_cache``, Table 2's "kNN-LM + continuous cache");
* TRIMELM_ext: BM25-packed batches (the offline packing runs first);
  evaluated with M_local u M_long (``trime``) and with the external memory
  (``trime_ext``, Eq. 6-9: tau, tau', lambda and the long-term size tuned).

Each model's datastore holds (g, next token) of every prediction of the
demo training split, with the evaluation windows' context
(``--mode=datastore``); a ScaNN index per metric (``--mode=index``) is
searched during tuning; ScaNN's recall@K against exact search is measured
on valid queries (``--mode=recall``), and valid and test are scored again
at the tuned setting with exact search (the paper's dagger rows). The table
lands in ``<workdir>/table.md`` and ``table.json``; a finished step is not
repeated when the demo is run again.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/extmem_demo", "Output directory."
)
_STEPS = flags.DEFINE_integer(
    "steps", None, "Override the training steps of both models."
)
_SIZE = flags.DEFINE_string("size", "demo", "Config size (demo or smoke).")
# Exact search over the 483K keys of the demo training split costs about
# 20 s per 1,024 queries on two CPU cores, so the evaluations score the
# first windows of valid and test (6,464 predictions each at 100).
_WINDOWS = flags.DEFINE_integer(
    "eval_windows", 100, "Evaluation windows of valid and test (0: all)."
)
_DOMAIN = flags.DEFINE_bool(
    "domain",
    False,
    "Also Table 5: score iwslt_en (non-Wikipedia English) with the datastore "
    "of the Wikipedia training split and with one of iwslt_en's training "
    "part.",
)
_METHODS = flags.DEFINE_list(
    "methods", ["vanilla", "trime_ext"], "Which models to run (rows of both)."
)

_ABLATIONS = flags.DEFINE_bool(
    "ablations",
    False,
    "Also Tables 11 and 15: TRIMELM_ext trained with random batches, without "
    "gradients into the memory, and with p = 0 and 0.5 of hiding the local "
    "memory, each with its own datastore, on valid.",
)

# (row, config variant method, its external kind)
MODELS = (
    ("vanilla", "vanilla", "knn"),
    ("TRIMELM_ext", "trime_ext", "trime_ext"),
)

# Tables 11 and 15: (row, run name, config overrides of trime_ext).
ABLATIONS = (
    ("random batches (Table 11)", "random_batches",
     {"data.batching": "random"}),
    ("no gradient into the memory (Table 11)", "stop_gradient_memory",
     {"loss.stop_gradient_memory": True}),
    ("p = 0 (Table 15)", "hide_p0", {"loss.local_hide_prob": 0.0}),
    ("p = 0.5 (Table 15)", "hide_p05", {"loss.local_hide_prob": 0.5}),
)  # fmt: skip


def _config(method: str, workdir: str, steps):
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top

  c = trime_wt103.get_config(f"{method}_{_SIZE.value}")
  c.data.cache_dir = os.path.join(workdir, "cache")
  if steps:
    c.train.num_steps = steps
  c.eval.max_windows = _WINDOWS.value
  c.datastore.shard_keys = 250_000  # two shards: searched and merged
  if method == "vanilla":  # kNN-LM's temperature: none (1) or tuned.
    c.eval_memory.knn_temperature_grid = (1.0, 3.0, 10.0)
  return c


def _cached(path: str, fn):
  """fn()'s result, stored as json at ``path`` (reused when present)."""
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  out = fn()
  out = {k: v for k, v in out.items() if k != "summary_lines"}
  with open(path, "w") as f:
    json.dump(out, f, indent=2, sort_keys=True, default=str)
  return out


def run_model(
    method: str,
    kind: str,
    workdir: str,
    steps,
    name: str = "",
    overrides: dict | None = None,
) -> dict:
  """Trains one model, builds its datastore and index, tunes and scores.

  ``name`` (default ``method``) is the run's folder; ``overrides``
  (dotted config keys) make an ablation, tuned with ScaNN on valid only.
  """
  from memjax.eval import memory_grid as em_lib  # pylint: disable=g-import-not-at-top
  from memjax import train  # pylint: disable=g-import-not-at-top
  from memjax.methods.trime import packing  # pylint: disable=g-import-not-at-top
  from memjax.methods.external import modes as external  # pylint: disable=g-import-not-at-top
  from memjax.modes import memory as memory_modes  # pylint: disable=g-import-not-at-top

  run = os.path.join(workdir, name or method)
  c = _config(method, workdir, steps)
  for key, value in (overrides or {}).items():
    section, field = key.split(".")
    c[section][field] = value
  t = {}
  step = lambda name, fn: _timed(t, name, os.path.join(run, f"{name}.json"), fn)  # noqa: E731
  os.makedirs(run, exist_ok=True)
  if c.data.batching == "bm25":
    step("pack", lambda: packing.pack(c, run))
  print(f"== {method}: train {c.train.num_steps} steps", flush=True)
  trained = step("train", lambda: train.train_and_evaluate(c, run))
  print(f"== {method}: datastore of the training split", flush=True)
  store = step("datastore", lambda: external.datastore(c, run))
  c.eval_memory.kind = kind
  step("index", lambda: external.index(c, run))
  out = {"method": method, "kind": kind, "train": trained, "datastore": store}
  out["seconds"] = t
  if overrides:
    print(f"== {name}: tune {kind} with ScaNN", flush=True)
    out["scann"] = step("tune_scann", lambda: memory_modes.tune(c, run))
    return out
  out["recall"] = step("recall", lambda: external.recall(c, run))
  if method == "trime_ext":
    c.eval_memory.kind = "trime"
    print(f"== {method}: tune M_local u M_long", flush=True)
    out["local_long"] = step("tune_trime", lambda: memory_modes.tune(c, run))
    c.eval_memory.kind = kind
  print(f"== {method}: tune {kind} with ScaNN", flush=True)
  out["scann"] = step("tune_scann", lambda: memory_modes.tune(c, run))
  best = em_lib.grid_of({"kind": kind, **out["scann"]["best"]})
  c.eval_memory.search = "exact"

  def exact():
    loaded = em_lib.load(c, run)
    return {
        s: memory_modes._score(loaded, s, best, desc=f"{kind} exact {s}")[  # pylint: disable=protected-access
            "grid"
        ][0]
        for s in ("valid", "test")
    }

  print(f"== {method}: score {kind} with exact search", flush=True)
  out["exact"] = step("exact", exact)
  if method == "vanilla":
    c.eval_memory.kind, c.eval_memory.search = "knn_cache", "scann"
    c.eval_memory.long_mem_grid = (0, 1024)
    print(f"== {method}: tune knn_cache with ScaNN", flush=True)
    out["knn_cache"] = step("tune_knn_cache", lambda: memory_modes.tune(c, run))
  return out


def run_domain(method: str, kind: str, workdir: str, steps) -> dict:
  """Table 5: the trained model on iwslt_en, two datastores."""
  from memjax.methods.external import modes as external  # pylint: disable=g-import-not-at-top
  from memjax.modes import memory as memory_modes  # pylint: disable=g-import-not-at-top

  run = os.path.join(workdir, method)
  c = _config(method, workdir, steps)
  c.eval.corpus = "iwslt_en"
  t = {}
  step = lambda name, fn: _timed(t, name, os.path.join(run, f"{name}.json"), fn)  # noqa: E731
  out = {"seconds": t}
  if method == "trime_ext":
    c.eval_memory.kind = "trime"
    print(f"== {method} on iwslt_en: tune M_local u M_long", flush=True)
    out["local_long"] = step("domain_trime", lambda: memory_modes.tune(c, run))
  c.eval_memory.kind = kind
  print(f"== {method} on iwslt_en: {kind}, Wikipedia datastore", flush=True)
  out["wiki"] = step("domain_wiki", lambda: memory_modes.tune(c, run))
  c.datastore.corpus = "iwslt_en"
  print(f"== {method}: datastore of iwslt_en's training part", flush=True)
  out["datastore"] = step(
      "domain_datastore", lambda: external.datastore(c, run)
  )
  step("domain_index", lambda: external.index(c, run))
  print(f"== {method} on iwslt_en: {kind}, iwslt_en datastore", flush=True)
  out["own"] = step("domain_own", lambda: memory_modes.tune(c, run))
  return out


def format_ablations(main: list[dict], ablations: list[dict]) -> str:
  """Markdown, Tables 11 and 15: valid perplexity of TRIMELM_ext variants."""
  lines = [
      "| TRIMELM_ext trained with | setting (tuned on valid) | valid ppl "
      "without memory | valid ppl, M_local u M_long u M_ext |",
      "|---|---|---:|---:|",
  ]
  rows = [dict(m, row="BM25 batches, gradients, p = 0.9") for m in main]
  for m in rows + ablations:
    r = m["scann"]
    lines.append(
        f"| {m['row']} | {em_setting(r['best'])} | "
        f"{r['valid']['plain']['ppl']:.2f} | {r['valid']['memory']['ppl']:.2f} |"
    )
  return "\n".join(lines)


def format_domain_table(models: list[dict]) -> str:
  """Markdown, Table 5's layout: iwslt_en perplexity per datastore."""
  lines = [
      "| model | memory at evaluation | datastore | setting (tuned on "
      "iwslt_en valid) | valid ppl | test ppl |",
      "|---|---|---|---|---:|---:|",
  ]
  for m in models:
    d, name = (
        m["domain"],
        {"vanilla": "vanilla", "trime_ext": "TRIMELM_ext"}[m["method"]],
    )
    plain = d["wiki"]
    lines.append(
        f"| {name} | - | - | - | {plain['valid']['plain']['ppl']:.2f} | "
        f"{plain['test']['plain']['ppl']:.2f} |"
    )
    rows = [("M_local u M_long", "-", d.get("local_long"))]
    mem = "M_ext" if m["kind"] == "knn" else "M_local u M_long u M_ext"
    rows += [(mem, "Wikipedia train", d["wiki"]), (mem, "iwslt_en train",
                                                  d["own"])]  # fmt: skip
    for what, store, r in rows:
      if r:
        lines.append(
            f"| {name} | {what} | {store} | {em_setting(r['best'])} | "
            f"{r['valid']['memory']['ppl']:.2f} | "
            f"{r['test']['memory']['ppl']:.2f} |"
        )
  return "\n".join(lines)


def _timed(times: dict, name: str, path: str, fn):
  start = time.time()
  out = _cached(path, fn)
  times[name] = time.time() - start
  return out


def format_table(models: list[dict]) -> str:
  """Markdown: one row per evaluation, Table 2's order."""
  by = {m["method"]: m for m in models}
  van, ext = by.get("vanilla"), by.get("trime_ext")
  lines = [
      "| model | memory at evaluation | setting (tuned on valid) | valid ppl "
      "| test ppl | test ppl, exact search | ScaNN recall@K |",
      "|---|---|---|---:|---:|---:|---:|",
  ]
  for name, m in (("vanilla", van), ("TRIMELM_ext", ext)):
    if m:
      lines.append(
          f"| {name} | - | - | {m['scann']['valid']['plain']['ppl']:.2f} | "
          f"{m['scann']['test']['plain']['ppl']:.2f} | - | - |"
      )

  def row(name, mem, r, m, exact=True):
    setting = em_setting(r["best"])
    tail = (
        f"{m['exact']['test']['ppl']:.2f} | {m['recall']['recall']:.3f}"
        if exact
        else "- | -"
    )
    return (
        f"| {name} | {mem} | {setting} | {r['valid']['memory']['ppl']:.2f} | "
        f"{r['test']['memory']['ppl']:.2f} | {tail} |"
    )

  if van:
    lines.append(row("vanilla + kNN-LM", "M_ext", van["scann"], van))
    lines.append(
        row("vanilla + kNN-LM + cache", "M_local u M_long; M_ext",
            van["knn_cache"], van, False)
    )  # fmt: skip
  if ext:
    lines.append(
        row("TRIMELM_ext", "M_local u M_long", ext["local_long"], ext, False)
    )
    lines.append(
        row("TRIMELM_ext", "M_local u M_long u M_ext", ext["scann"], ext)
    )
  return "\n".join(lines)


def em_setting(best: dict) -> str:
  from memjax.eval import memory_grid as em_lib  # pylint: disable=g-import-not-at-top

  return em_lib.setting_str(best).replace("long_mem_tokens", "N")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  import jax  # pylint: disable=g-import-not-at-top
  import platform  # pylint: disable=g-import-not-at-top

  workdir = _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  start = time.time()
  models = [
      run_model(method, kind, workdir, _STEPS.value)
      for _, method, kind in MODELS
      if method in _METHODS.value
  ]
  ablations = [
      dict(run_model("trime_ext", "trime_ext", workdir, _STEPS.value, name,
                     overrides), row=row)
      for row, name, overrides in (ABLATIONS if _ABLATIONS.value else ())
  ]  # fmt: skip
  if _DOMAIN.value:
    for m in models:
      m["domain"] = run_domain(m["method"], m["kind"], workdir, _STEPS.value)
  elapsed = time.time() - start
  table = format_table(models)
  if ablations:
    table += "\n\nAblations (valid):\n\n" + format_ablations(
        [m for m in models if m["method"] == "trime_ext"], ablations
    )
  if _DOMAIN.value:
    table += "\n\nDomain adaptation (iwslt_en):\n\n" + format_domain_table(
        models
    )
  machine = (
      f"{platform.machine()}, {os.cpu_count()} CPU cores, "
      f"{jax.devices()[0].platform}, jax {jax.__version__}"
  )
  with open(os.path.join(workdir, "table.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(workdir, "table.json"), "w") as f:
    json.dump(
        {"models": models, "seconds": elapsed, "machine": machine},
        f, indent=2, sort_keys=True, default=str,
    )  # fmt: skip
  for m in models:
    ds, rec = m["datastore"], m["recall"]
    print(
        f"{m['method']}: datastore {ds['keys']} keys x {ds['dim']} "
        f"({ds['bytes_per_key']:.0f} bytes/key, {ds['keys'] / ds['seconds']:.0f}"
        f" keys/s); ScaNN recall@{rec['k']} {rec['recall']:.3f} at "
        f"{rec['speedup']:.1f}x exact's queries/s"
    )
  print(f"\nExternal memory demo ({elapsed:.0f}s on {machine}):\n{table}\n")
  print(f"written: {os.path.join(workdir, 'table.md')}")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
