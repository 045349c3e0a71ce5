"""The rows of the MARGE demo's early-token table: configs and table.

Each row is a demo-size run of its own config, trained on the demo corpus
(``demo_data/wikitext``, one word vocabulary) with the vanilla row's steps
and training tokens per step, and scored by ``--mode=position_loss`` on the
sections of the test split:

* ``vanilla``, ``marge``: ``configs/marge_wt103.py:vanilla_demo`` / ``demo``;
* ``txl``: ``configs/txl_wt103.py:txl_demo``, memory carried within a
  section;
* ``trime_long``: ``configs/trime_wt103.py:trime_long_demo`` (TRIMELM_long),
  scored with its evaluation memory (M_local u M_long of the section);
* ``knn``: the vanilla run with a datastore of its training split and its
  ScaNN index, scored as a kNN-LM;
* ``pkm``: ``configs/pkm_wt103.py:pkm_demo``, the model alone.

``memjax/demos/marge.py`` trains and scores the rows; this module holds what
needs no training (configs, table, plot) so it can be tested by itself.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from memjax import errors
from memjax.demos import common

SPLIT = "test"


ROWS = {
    r.key: r
    for r in (
        common.Row("vanilla", "vanilla LM", "marge_wt103", "vanilla_demo"),
        common.Row(
            "txl",
            "Transformer-XL (memory carried)",
            "txl_wt103",
            "txl_demo",
        ),
        common.Row(
            "trime_long",
            "TRIMELM_long (local + long memory)",
            "trime_wt103",
            "trime_long_demo",
            options={"memory": "eval"},
        ),
        common.Row(
            "knn",
            "kNN-LM (vanilla LM + datastore)",
            "marge_wt103",
            "vanilla_demo",
            base="vanilla",
            # Scored in batches of eval_memory.batch_size (8) windows: a
            # batch is padded at each section's end and every padded query
            # is searched too. The datastore is built 64 windows a batch.
            options={
                "memory": "eval",
                "eval_memory": {"kind": "knn"},
                "datastore": {"batch_size": 64},
            },
        ),
        common.Row("pkm", "PKM LM", "pkm_wt103", "pkm_demo"),
        common.Row("marge", "MARGE, retrieval off", "marge_wt103", "demo"),
    )
}
# Each row's options: "memory", its position_loss.memory ('none', the
# default: the model alone or with its own carried memory; 'eval': its
# evaluation memory); "eval_memory" and "datastore", overrides of those
# sections. base: the row whose run it reads instead of training one.
# The rows of the existing demo keep their configs as they are; the others
# train on the test split only and match the vanilla row's steps and tokens.
REFERENCE_ROWS = ("vanilla", "marge")


def parse_rows(text: str) -> list[str]:
  """'vanilla,marge,knn' -> names, base runs first.

  Raises:
    errors.ConfigError: (a ValueError) naming unknown rows, or none given.
  """
  names = [n.strip() for n in text.split(",") if n.strip()]
  if not names:
    raise errors.ConfigError(
        f"unknown --rows {text!r}; use a comma-separated subset of "
        f"{list(ROWS)}"
    )
  rows = common.select(list(ROWS.values()), names)
  names += [r.base for r in rows if r.base]  # the kNN-LM reads vanilla's run
  return [n for n in ROWS if n in names]


def _get_config(row: common.Row):
  return common.load_config(row.config, row.variant)


def row_config(name: str, base_run_dir: Optional[str] = None):
  """The config of row ``name``.

  Args:
    name: a key of ROWS.
    base_run_dir: the run directory of ``ROWS[name].base`` (rows that
      read another row's run).

  Returns:
    The ConfigDict: sections as documents; the reference rows unchanged
    otherwise; the others with the vanilla row's ``train.num_steps`` and
    ``data.batch_size`` scaled so a step has the vanilla row's tokens, the
    test split only, and the row's ``position_loss.memory``.
  """
  spec = ROWS[name]
  c = _get_config(spec)
  c.position_loss.documents = "sections"
  if name in REFERENCE_ROWS:
    return c
  ref = _get_config(ROWS["vanilla"])
  tokens = ref.data.batch_size * ref.data.seq_len
  if tokens % c.data.seq_len:
    raise ValueError(
        f"{name}: seq_len {c.data.seq_len} does not divide {tokens}"
    )
  c.train.num_steps = ref.train.num_steps
  c.data.batch_size = tokens // c.data.seq_len
  c.eval.splits = (SPLIT,)
  c.position_loss.memory = spec.options.get("memory", "none")
  for section in ("eval_memory", "datastore"):
    for key, value in spec.options.get(section, {}).items():
      c[section][key] = value
  if spec.base:
    c.train.init_from = base_run_dir or ""
  return c


def train_tokens(config) -> int:
  """Training tokens seen: steps x batch x window (``data.seq_len``)."""
  d = config.data
  return int(config.train.num_steps) * int(d.batch_size) * int(d.seq_len)


def overall_nll(buckets: list[dict[str, Any]]) -> Optional[float]:
  """Token-weighted mean nll over all buckets (None without tokens)."""
  n = sum(b["tokens"] for b in buckets if b["nll"] is not None)
  if not n:
    return None
  return (
      sum(b["nll"] * b["tokens"] for b in buckets if b["nll"] is not None) / n
  )


def make_row(
    name: str,
    config,
    results: dict[str, Any],
    positions: dict[str, Any],
) -> dict[str, Any]:
  """A table row from a run's results.json and its position_loss.json.

  ``ppl`` is the run's own test evaluation (None for a row that reads
  another row's run); ``section_ppl`` is exp of the mean nll over every
  scored token of the sections (context reset at each section).
  """
  spec = ROWS[name]
  buckets = positions[SPLIT]["buckets"]
  nll = overall_nll(buckets)
  label = spec.label
  if name == "knn":
    label += f", lambda {config.external.knn_lambda}"
  elif name == "pkm":
    layers = ", ".join(str(i) for i in config.model.feed_forward_layers)
    label += f" (memory layers {layers})"
  return dict(
      row=name,
      label=label,
      params=int(results["num_params"]),
      train_tokens=train_tokens(config),
      ppl=None if spec.base else results[SPLIT]["ppl"],
      section_ppl=None if nll is None else math.exp(nll),
      buckets=buckets,
  )


def _cells(values: list[Optional[float]], fmt: str) -> list[str]:
  return ["-" if v is None else format(v, fmt) for v in values]


def format_table(rows: list[dict[str, Any]]) -> str:
  """Markdown: params, training tokens, ppl and loss per position bucket.

  A row with ``marge_eval`` (MARGE's retrieval on / off over S_t+1) adds
  its two rows at the end.
  """
  labels = [b["bucket"] for b in rows[0]["buckets"]]
  body = []
  for r in rows:
    body.append(
        [r["label"], f"{r['params']:,}", f"{r['train_tokens']:,}"]
        + _cells([r["ppl"], r["section_ppl"]], ".2f")
        + _cells([b["nll"] for b in r["buckets"]], ".3f")
    )
  for r in rows:
    for key, name in (("retrieval", "on"), ("no_retrieval", "off")):
      if "marge_eval" in r:
        e = r["marge_eval"][key]
        body.append(
            [f"MARGE, retrieval {name} (S_t+1 tokens only)", f"{r['params']:,}"]
            + [f"{r['train_tokens']:,}", f"{e['ppl']:.2f}", "-"]
            + _cells([b["nll"] for b in e["buckets"]], ".3f")
        )
  head = ["model", "params", "train tokens", f"{SPLIT} ppl", "section ppl"]
  return common.markdown(head + labels, "lrrrr" + "r" * len(labels), body)


def plot_series(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict]]]:
  """(name, buckets) of each line of the plot: every row, then MARGE's
  retrieval on / off over the S_t+1 tokens."""
  series = [(r["label"], r["buckets"]) for r in rows]
  for r in rows:
    if "marge_eval" in r:
      for key, name in (("retrieval", "on"), ("no_retrieval", "off")):
        series.append(
            (
                f"MARGE, retrieval {name} (S_t+1)",
                r["marge_eval"][key]["buckets"],
            )
        )
  return series
