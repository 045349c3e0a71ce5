"""The external-memory demo: kNN-LM and TRIMELM_ext on the demo corpus.

    python -m memjax.demos.external --workdir=runs/extmem_demo   # make demo-ext

Two models train with the TRIME demo's steps, model and batch
(``configs/trime_wt103.py``, size ``demo``; ``external_rows.MODELS``):

* vanilla: the plain LM objective; evaluated without memory, with
  kNN-LM (``knn``: squared L2, lambda and temperature tuned on valid) and
  with kNN-LM plus a continuous cache over M_local (``knn_cache`` with
  N = 0, Table 2's "kNN-LM + continuous cache");
* TRIMELM_ext: BM25-packed batches (the offline packing runs first);
  evaluated with M_local u M_long (``trime``), with the external memory
  (``trime_ext``, Eq. 6-9: tau, tau', lambda and the long-term size tuned),
  and with M_local u M_ext (``trime_ext`` with N = 0: Table 2's "TRIMELM_ext
  w/o M_long", which §5.1 sets beside kNN-LM + continuous cache because the
  two read the same memories).

Each model's datastore holds (g, next token) of every prediction of the
demo training split, with the evaluation windows' context
(``--mode=datastore``); a ScaNN index per metric (``--mode=index``) is
searched during tuning; ScaNN's recall@K against exact search is measured
on valid queries (``--mode=recall``), and valid and test are scored again
at the tuned setting with exact search (the paper's dagger rows). The table
lands in ``<workdir>/table.md`` and ``table.json``; a finished step is not
repeated when the demo is run again (each step is kept under a name that
says its memories, so a step whose setting changed runs again).
"""

from __future__ import annotations

from typing import Any, Callable

from absl import flags

import memjax
from memjax.demos import common
from memjax.demos import external_rows

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
_PACK_RUNNER = flags.DEFINE_string(
    "pack_runner",
    "",
    "Run TRIMELM_ext's BM25 packing as an Apache Beam pipeline on this "
    "runner (e.g. DirectRunner; config pack.runner), which writes a cached "
    "SeqIO task that training reads; empty: in this process. Either way the "
    "order is the same.",
)


def _config(demo: common.Demo, row: common.Row, steps: int | None) -> Any:
  c = demo.config(row.config, f"{row.variant}_{_SIZE.value}", steps)
  c.eval.max_windows = _WINDOWS.value
  c.pack.runner = _PACK_RUNNER.value
  c.datastore.shard_keys = 250_000  # two shards: searched and merged
  if row.variant == "vanilla":  # kNN-LM's temperature: none (1) or tuned.
    c.external.knn_temperature_grid = (1.0, 3.0, 10.0)
  for key, value in row.options.get("overrides", {}).items():
    section, field = key.split(".")
    c[section][field] = value
  return c


def _build(stages: common.Stages, c: Any, row: common.Row) -> dict:
  """Packs (BM25 batches), trains, and builds the datastore and its index."""
  run = stages.run_dir
  if c.data.batching == "bm25":
    # The packing stage keeps its files beside the run (<run>_pack/); the
    # BM25 order itself lands in the data cache, where training reads it.
    packed = common.Stages(f"{run}_pack")
    packed("pack", lambda: memjax.run_mode("pack", c, packed.run_dir))
    stages.times.update(packed.times)
  print(f"== {row.variant}: train {c.train.num_steps} steps", flush=True)
  trained = stages("train", lambda: common.train(c, run))
  print(f"== {row.variant}: datastore of the training split", flush=True)
  store = stages("datastore", lambda: memjax.run_mode("datastore", c, run))
  c.eval_memory.kind = row.options["kind"]
  stages("index", lambda: memjax.run_mode("index", c, run))
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
  from memjax import build
  from memjax.eval import grid as grid_lib
  from memjax.modes import memory_eval as memory_modes
  from memjax.run import restore

  c.eval_memory.search = "exact"
  built = build.build(c, run)
  setting = grid_lib.grid_of({"kind": kind, **best}, built.parts.eval_memories)
  loaded = restore.load_splits(built)
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
  the config's evaluation memory as it is when the stage runs (kept under
  ``stage`` and a digest of those settings, ``external_rows.stage_name``)."""
  c = _config(demo, row, steps)
  stages = common.Stages(demo.run_dir(row))

  def tune(stage: str) -> dict:
    name = external_rows.stage_name(stage, external_rows.memory_settings(c))
    return stages(name, lambda: memjax.run_mode("tune", c, stages.run_dir))

  return c, stages, tune


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
  c, stages, tune = _prepare(demo, row, steps)
  run, method, kind = stages.run_dir, row.variant, row.options["kind"]
  out = _build(stages, c, row)
  if "overrides" in row.options:
    print(f"== {row.key}: tune {kind} with ScaNN", flush=True)
    out["scann"] = tune("tune_scann")
    return out
  out["recall"] = stages("recall", lambda: memjax.run_mode("recall", c, run))
  if method == "trime_ext":
    out["local_long"] = _local_long(c, tune, "tune_trime", method)
  print(f"== {method}: tune {kind} with ScaNN", flush=True)
  out["scann"] = tune("tune_scann")
  print(f"== {method}: score {kind} with exact search", flush=True)
  best = out["scann"]["best"]
  exact = external_rows.stage_name(
      "exact", {**external_rows.memory_settings(c), "best": best}
  )
  out["exact"] = stages(exact, lambda: _exact(c, run, kind, best))
  out["without_long"] = external_rows.tune_local(c, method, tune)
  return out


def run_domain(
    demo: common.Demo, row: common.Row, steps: int | None
) -> dict[str, Any]:
  """Table 5: the trained model on iwslt_en, two datastores."""
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
      "domain_datastore", lambda: memjax.run_mode("datastore", c, run)
  )
  stages("domain_index", lambda: memjax.run_mode("index", c, run))
  print(f"== {method} on iwslt_en: {kind}, iwslt_en datastore", flush=True)
  out["own"] = tune("domain_own")
  return out


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
  selected = common.select(external_rows.MODELS, _METHODS.value, flag="methods")
  models = [run_model(demo, row, steps) for row in selected]
  ablations = [
      dict(run_model(demo, row, steps), row=row.label)
      for row in (external_rows.ABLATIONS if _ABLATIONS.value else ())
  ]
  if _DOMAIN.value:
    for row, m in zip(selected, models):
      m["domain"] = run_domain(demo, row, steps)
  table = external_rows.format_table(models)
  if ablations:
    table += "\n\nAblations (valid):\n\n" + external_rows.format_ablations(
        [m for m in models if m["method"] == "trime_ext"], ablations
    )
  if _DOMAIN.value:
    table += (
        "\n\nDomain adaptation (iwslt_en):\n\n"
        + external_rows.format_domain_table(models)
    )
  _print_datastores(models)
  demo.finish({"models": models}, table, title="External memory demo")


if __name__ == "__main__":
  common.run(main)
