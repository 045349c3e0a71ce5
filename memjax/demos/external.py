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

from typing import Any, Callable

from absl import flags

from memjax.demos import common

FLAGS = common.define_flags(
    "runs/extmem_demo", steps="Override the training steps of both models."
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
    common.Row(key, label, "trime_wt103", "trime_ext",
               options={"kind": "trime_ext", "overrides": overrides})
    for label, key, overrides in (
        ("random batches (Table 11)", "random_batches",
         {"data.batching": "random"}),
        ("no gradient into the memory (Table 11)", "stop_gradient_memory",
         {"loss.stop_gradient_memory": True}),
        ("p = 0 (Table 15)", "hide_p0", {"loss.local_hide_prob": 0.0}),
        ("p = 0.5 (Table 15)", "hide_p05", {"loss.local_hide_prob": 0.5}),
    )
)  # fmt: skip


def _config(demo: common.Demo, row: common.Row, steps: int | None) -> Any:
  c = demo.config(row.config, f"{row.variant}_{_SIZE.value}", steps)
  c.eval.max_windows = _WINDOWS.value
  c.datastore.shard_keys = 250_000  # two shards: searched and merged
  if row.variant == "vanilla":  # kNN-LM's temperature: none (1) or tuned.
    c.eval_memory.knn_temperature_grid = (1.0, 3.0, 10.0)
  for key, value in row.options.get("overrides", {}).items():
    section, field = key.split(".")
    c[section][field] = value
  return c


def _build(stages: common.Stages, c: Any, row: common.Row) -> dict:
  """Packs (BM25 batches), trains, and builds the datastore and its index."""
  # pylint: disable=g-import-not-at-top
  from memjax.methods.external import modes as external
  from memjax.methods.trime import packing

  run = stages.run_dir
  if c.data.batching == "bm25":
    stages("pack", lambda: packing.pack(c, run))
  print(f"== {row.variant}: train {c.train.num_steps} steps", flush=True)
  trained = stages("train", lambda: common.train(c, run))
  print(f"== {row.variant}: datastore of the training split", flush=True)
  store = stages("datastore", lambda: external.datastore(c, run))
  c.eval_memory.kind = row.options["kind"]
  stages("index", lambda: external.index(c, run))
  return {
      "method": row.variant,
      "kind": row.options["kind"],
      "train": trained,
      "datastore": store,
      "seconds": stages.times,
  }


def _exact(c: Any, run: str, kind: str, best: dict) -> dict:
  """Valid and test scored at the setting ``best`` with exact search."""
  # pylint: disable=g-import-not-at-top
  from memjax.eval import memory_grid as em_lib
  from memjax.modes import memory as memory_modes

  setting = em_lib.grid_of({"kind": kind, **best})
  c.eval_memory.search = "exact"
  loaded = em_lib.load(c, run)
  return {
      s: memory_modes.score_split(loaded, s, setting, desc=f"{kind} exact {s}")[
          "grid"
      ][0]
      for s in ("valid", "test")
  }


def _prepare(
    demo: common.Demo, row: common.Row, steps: int | None
) -> tuple[Any, common.Stages, Callable[[str], dict]]:
  """A row's config, its stages, and ``tune(stage)``: the stage that tunes
  the config's evaluation memory as it is when the stage runs."""
  from memjax.modes import memory as memory_modes  # pylint: disable=g-import-not-at-top

  c = _config(demo, row, steps)
  stages = common.Stages(demo.run_dir(row))
  return (
      c,
      stages,
      lambda name: stages(name, lambda: memory_modes.tune(c, stages.run_dir)),
  )


def _local_long(
    c: Any, tune: Callable[[str], dict], stage: str, what: str
) -> dict:
  """Stage ``stage``: TRIMELM_ext tuned with M_local u M_long; the config's
  evaluation memory is its own again after it."""
  kind, c.eval_memory.kind = c.eval_memory.kind, "trime"
  print(f"== {what}: tune M_local u M_long", flush=True)
  out = tune(stage)
  c.eval_memory.kind = kind
  return out


def run_model(
    demo: common.Demo, row: common.Row, steps: int | None
) -> dict[str, Any]:
  """Trains one model, builds its datastore and index, tunes and scores.

  An ablation row (config ``overrides``) is tuned with ScaNN on valid only.
  """
  from memjax.methods.external import modes as external  # pylint: disable=g-import-not-at-top

  c, stages, tune = _prepare(demo, row, steps)
  run, method, kind = stages.run_dir, row.variant, row.options["kind"]
  out = _build(stages, c, row)
  if "overrides" in row.options:
    print(f"== {row.key}: tune {kind} with ScaNN", flush=True)
    out["scann"] = tune("tune_scann")
    return out
  out["recall"] = stages("recall", lambda: external.recall(c, run))
  if method == "trime_ext":
    out["local_long"] = _local_long(c, tune, "tune_trime", method)
  print(f"== {method}: tune {kind} with ScaNN", flush=True)
  out["scann"] = tune("tune_scann")
  print(f"== {method}: score {kind} with exact search", flush=True)
  best = out["scann"]["best"]
  out["exact"] = stages("exact", lambda: _exact(c, run, kind, best))
  if method == "vanilla":
    c.eval_memory.kind, c.eval_memory.search = "knn_cache", "scann"
    c.eval_memory.long_mem_grid = (0, 1024)
    print(f"== {method}: tune knn_cache with ScaNN", flush=True)
    out["knn_cache"] = tune("tune_knn_cache")
  return out


def run_domain(
    demo: common.Demo, row: common.Row, steps: int | None
) -> dict[str, Any]:
  """Table 5: the trained model on iwslt_en, two datastores."""
  from memjax.methods.external import modes as external  # pylint: disable=g-import-not-at-top

  c, stages, tune = _prepare(demo, row, steps)
  c.eval.corpus = "iwslt_en"
  run, method, kind = stages.run_dir, row.variant, row.options["kind"]
  out = {"seconds": stages.times}
  if method == "trime_ext":
    where = f"{method} on iwslt_en"
    out["local_long"] = _local_long(c, tune, "domain_trime", where)
  c.eval_memory.kind = kind
  print(f"== {method} on iwslt_en: {kind}, Wikipedia datastore", flush=True)
  out["wiki"] = tune("domain_wiki")
  c.datastore.corpus = "iwslt_en"
  print(f"== {method}: datastore of iwslt_en's training part", flush=True)
  out["datastore"] = stages(
      "domain_datastore", lambda: external.datastore(c, run)
  )
  stages("domain_index", lambda: external.index(c, run))
  print(f"== {method} on iwslt_en: {kind}, iwslt_en datastore", flush=True)
  out["own"] = tune("domain_own")
  return out


def format_ablations(main: list[dict], ablations: list[dict]) -> str:
  """Markdown, Tables 11 and 15: valid perplexity of TRIMELM_ext variants."""
  rows = [dict(m, row="BM25 batches, gradients, p = 0.9") for m in main]
  body = [
      [
          m["row"], em_setting(m["scann"]["best"]),
          f"{m['scann']['valid']['plain']['ppl']:.2f}",
          f"{m['scann']['valid']['memory']['ppl']:.2f}",
      ]
      for m in rows + ablations
  ]  # fmt: skip
  head = [
      "TRIMELM_ext trained with", "setting (tuned on valid)",
      "valid ppl without memory", "valid ppl, M_local u M_long u M_ext",
  ]  # fmt: skip
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
        [name, "-", "-", "-", f"{plain['valid']['plain']['ppl']:.2f}",
         f"{plain['test']['plain']['ppl']:.2f}"]
    )  # fmt: skip
    mem = "M_ext" if m["kind"] == "knn" else "M_local u M_long u M_ext"
    for what, store, r in (
        ("M_local u M_long", "-", d.get("local_long")),
        (mem, "Wikipedia train", d["wiki"]),
        (mem, "iwslt_en train", d["own"]),
    ):
      if r:
        body.append([name, what, store, *_memory_cells(r)])
  head = [
      "model", "memory at evaluation", "datastore",
      "setting (tuned on iwslt_en valid)", "valid ppl", "test ppl",
  ]  # fmt: skip
  return common.markdown(head, "llllrr", body)


def format_table(models: list[dict]) -> str:
  """Markdown: one row per evaluation, Table 2's order."""
  by = {m["method"]: m for m in models}
  van, ext = by.get("vanilla"), by.get("trime_ext")
  body = [
      [name, "-", "-", f"{m['scann']['valid']['plain']['ppl']:.2f}",
       f"{m['scann']['test']['plain']['ppl']:.2f}", "-", "-"]
      for name, m in (("vanilla", van), ("TRIMELM_ext", ext))
      if m
  ]  # fmt: skip

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
        row("vanilla + kNN-LM + cache", "M_local u M_long; M_ext",
            van["knn_cache"])
    )  # fmt: skip
  if ext:
    body.append(row("TRIMELM_ext", "M_local u M_long", ext["local_long"]))
    body.append(
        row("TRIMELM_ext", "M_local u M_long u M_ext", ext["scann"], ext)
    )
  head = [
      "model", "memory at evaluation", "setting (tuned on valid)", "valid ppl",
      "test ppl", "test ppl, exact search", "ScaNN recall@K",
  ]  # fmt: skip
  return common.markdown(head, "lllrrrr", body)


def em_setting(best: dict) -> str:
  from memjax.eval import memory_grid as em_lib  # pylint: disable=g-import-not-at-top

  return em_lib.setting_str(best).replace("long_mem_tokens", "N")


def _print_datastores(models: list[dict]) -> None:
  for m in models:
    ds, rec = m["datastore"], m["recall"]
    print(
        f"{m['method']}: datastore {ds['keys']} keys x {ds['dim']} "
        f"({ds['bytes_per_key']:.0f} bytes/key, {ds['keys'] / ds['seconds']:.0f}"
        f" keys/s); ScaNN recall@{rec['k']} {rec['recall']:.3f} at "
        f"{rec['speedup']:.1f}x exact's queries/s"
    )


def main() -> None:
  demo = common.Demo(FLAGS.workdir.value)
  steps = FLAGS.steps.value
  selected = common.select(MODELS, _METHODS.value, flag="methods")
  models = [run_model(demo, row, steps) for row in selected]
  ablations = [
      dict(run_model(demo, row, steps), row=row.label)
      for row in (ABLATIONS if _ABLATIONS.value else ())
  ]
  if _DOMAIN.value:
    for row, m in zip(selected, models):
      m["domain"] = run_domain(demo, row, steps)
  table = format_table(models)
  if ablations:
    table += "\n\nAblations (valid):\n\n" + format_ablations(
        [m for m in models if m["method"] == "trime_ext"], ablations
    )
  if _DOMAIN.value:
    table += "\n\nDomain adaptation (iwslt_en):\n\n" + format_domain_table(
        models
    )
  _print_datastores(models)
  demo.finish({"models": models}, table, title="External memory demo")


if __name__ == "__main__":
  common.run(main)
