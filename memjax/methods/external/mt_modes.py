"""Translation with an external memory (kNN-MT, TRIMEMT_ext); see
docs/trime_mt.md.

* ``--mode=mt_datastore``: the datastore of the training targets' decoder
  states (``translation/mt_datastore.py``) and its ScaNN index for the
  metric of ``mt_memory.kind``; with
  ``mt_memory.show_sentences``, what the memory retrieves along
  each of those sentences' greedy translations (exact search), in
  ``<workdir>/mt_retrieved.json`` (``retrieved_tokens``).
* ``--mode=mt_tune``: K, lam and the temperature on valid by teacher-forced
  NLL (beam search over a grid is too slow); writes
  ``<workdir>/mt_tune_<kind>.json``.
* ``--mode=mt_translate``: beam search with the memory on
  ``translation.split``, scored with sacreBLEU (the tuned settings when
  ``mt_tune`` has written them, else the config's).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.checkpoints import runfiles
from memjax.io import console
from memjax.io import paths
from memjax.methods.external import config as ext_config
from memjax.methods.external import memory_decoding as md
from memjax.methods.external import mt_datastore
from memjax.run import restore
from memjax.run import spec
from memjax.tasks import config as task_config
from memjax.tasks.translation import bleu
from memjax.tasks.translation import parts

Settings = settings_lib.Settings


def _restore(run: spec.Run) -> restore.Restored:
  return restore.restore_source(run)


def _split(s: Settings, restored: restore.Restored, split: str) -> Any:
  spm = paths.local_file(paths.join(restored.path, runfiles.SPM_FILE))
  return parts.read_split(s, split, spm, restored.path)


def _kind(s: Settings) -> str:
  """The memory kind; raises ConfigError for a bad kind or lambda."""
  mem = s.of(ext_config.MtMemory)
  if mem.kind not in ("knn", "trime"):
    raise errors.ConfigError(
        f"mt_memory.kind must be 'knn' or 'trime', got {mem.kind!r}"
    )
  # At lambda = 1 the model's own distribution is gone: with no neighbour
  # holding EOS, the EOS forced at the length limit has probability 0 and
  # beam search finishes no hypothesis.
  for key in ("knn_lambda", "interpolate_lambda"):
    for name, values in (
        (key, [getattr(mem, key)]),
        (f"{key}_grid", getattr(mem, key + "_grid")),
    ):
      bad = [v for v in values if not 0.0 <= float(v) < 1.0]
      if bad:
        raise errors.ConfigError(
            f"mt_memory.{name} must lie in [0, 1), got {bad[0]}"
        )
  return mem.kind


def mt_datastore_mode(run: spec.Run) -> dict:
  """``--mode=mt_datastore``: builds (or resumes) the datastore and index."""
  s, workdir = run.settings, run.workdir
  kind = _kind(s)
  restored = _restore(run)
  mem = s.of(ext_config.MtMemory)
  path = mt_datastore.datastore_path(s, workdir)
  start = time.time()
  store = mt_datastore.build(s, restored, _split(s, restored, "train"), path)
  built = time.time() - start
  if store is None:  # other processes' shards are still missing
    index, count = mt_datastore.process_share(s)
    return {
        "mode": "mt_datastore",
        "seconds": built,
        "results_path": paths.join(path, "build.json"),
        "summary_lines": [
            f"MT datastore {path}: process {index} of {count} wrote its "
            f"shards in {built:.0f}s; the last process joins them"
        ],
    }
  k = max(int(mem.k), *[int(x) for x in mem.k_grid])
  mt_datastore.searcher(store, md.metric_of(kind), mem, k)
  out = {
      "mode": "mt_datastore",
      "keys": store.count,
      "dim": store.dim,
      "seconds": built,
      "index_seconds": time.time() - start - built,
      "results_path": paths.join(path, "manifest.json"),
      "summary_lines": [
          f"MT datastore {path}: {store.count} keys x {store.dim} in "
          f"{built:.0f}s; {md.metric_of(kind)} index in "
          f"{time.time() - start - built:.0f}s"
      ],
  }
  shown = tuple(mem.show_sentences)
  if shown:
    found = retrieved_tokens(
        s, restored, store, shown, metric=md.metric_of(kind)
    )
    out["retrieved"] = [
        {"source": sentence, "positions": positions}
        for sentence, positions in zip(shown, found)
    ]
    out["retrieved_path"] = paths.join(workdir, "mt_retrieved.json")
    paths.write_json(out["retrieved_path"], out["retrieved"])
  return out


def settings_of(mem: ext_config.MtMemory) -> dict[str, Any]:
  """The memory settings of ``mt_memory``."""
  return {
      "k": int(mem.k),
      "knn_lambda": float(mem.knn_lambda),
      "knn_temperature": float(mem.knn_temperature),
      "temperature": float(mem.temperature),
      "interpolate": bool(mem.interpolate),
      "unnormalised": bool(mem.unnormalised),
      "lambda": float(mem.interpolate_lambda),
  }


def grid_of(kind: str, mem: ext_config.MtMemory) -> list[dict[str, Any]]:
  """Every setting tuned: K x (lam x T) for kNN-MT, K x tau (x lam with
  ``interpolate``) for TRIMEMT_ext."""
  base = settings_of(mem)
  if kind == "knn":
    axes = {
        "knn_lambda": mem.knn_lambda_grid,
        "knn_temperature": mem.knn_temperature_grid,
    }
  else:
    axes = {"temperature": mem.temperature_grid}
    if mem.interpolate:
      axes["lambda"] = mem.interpolate_lambda_grid
  names = ["k"] + list(axes)
  values = [mem.k_grid] + [axes[n] for n in names[1:]]
  return [
      dict(base, **dict(zip(names, combo)))
      for combo in itertools.product(*values)
  ]


def teacher_forced_memory(
    s: Settings, restored: Any, split: Any, neighbours: Any, limit: int
) -> dict[str, np.ndarray]:
  """Host arrays over the scored positions of ``split``'s first ``limit``
  pairs: tlp, log_z, targets [Q] and their neighbours' scores, values
  [Q, K]."""
  cols: dict[str, list[np.ndarray]] = {
      k: [] for k in ("tlp", "log_z", "targets", "scores", "values")
  }
  for out in mt_datastore.teacher_forced(s, restored, split, limit):
    ok = out["weights"].reshape(-1) > 0
    for key in ("tlp", "log_z", "targets"):
      cols[key].append(out[key].reshape(-1)[ok])
    g = out["g"].reshape(-1, out["g"].shape[-1])[ok]
    scores, values = neighbours(g)
    cols["scores"].append(scores)
    cols["values"].append(values)
  return {k: np.concatenate(v) for k, v in cols.items()}


def tune_grid(kind: str, grid, tf: dict[str, np.ndarray], dim: int) -> list:
  """Teacher-forced NLL per target token of every setting of ``grid``."""
  rows = []
  for setting in grid:
    k = int(setting["k"])
    logp = md.target_log_probs(
        kind,
        setting,
        jnp.asarray(tf["tlp"]),
        jnp.asarray(tf["log_z"]),
        jnp.asarray(tf["scores"][:, :k]),
        jnp.asarray(tf["values"][:, :k]),
        jnp.asarray(tf["targets"]),
        dim,
    )
    rows.append(dict(setting, nll=float(-jnp.mean(logp))))
  return rows


def mt_tune(run: spec.Run) -> dict:
  """``--mode=mt_tune``: the grid on valid by teacher-forced NLL."""
  s, workdir = run.settings, run.workdir
  kind = _kind(s)
  mem = s.of(ext_config.MtMemory)
  restored = _restore(run)
  store = mt_datastore.open_store(
      restored, mt_datastore.datastore_path(s, workdir)
  )
  grid = grid_of(kind, mem)
  kmax = max(int(s["k"]) for s in grid)
  neighbours = mt_datastore.Neighbours(
      mt_datastore.searcher(store, md.metric_of(kind), mem, kmax), kmax
  )
  tf = teacher_forced_memory(
      s,
      restored,
      _split(s, restored, "valid"),
      neighbours,
      int(mem.tune_sentences),
  )
  rows = tune_grid(kind, grid, tf, int(restored.model.cfg.d_model))
  best = min(rows, key=lambda r: r["nll"])
  plain = float(-np.mean(tf["tlp"]))
  out = {
      "kind": kind,
      "tokens": int(len(tf["tlp"])),
      "nll_without_memory": plain,
      "best": best,
      "grid": rows,
  }
  path = paths.join(workdir, f"mt_tune_{kind}.json")
  paths.write_json(path, out)
  return {
      **out,
      "results_path": path,
      "summary_lines": [
          f"{kind}: valid teacher-forced NLL {plain:.4f} without memory, "
          f"{best['nll']:.4f} with "
          + ", ".join(f"{k}={v}" for k, v in best.items() if k != "nll")
      ],
  }


def tuned_settings(s: Settings, workdir: str, kind: str) -> dict[str, Any]:
  """The best settings ``mt_tune`` wrote, else the config's."""
  path = paths.join(workdir, f"mt_tune_{kind}.json")
  if paths.exists(path):
    with paths.open(path) as f:
      return json.load(f)["best"]
  return settings_of(s.of(ext_config.MtMemory))


def make_hook(
    s: Settings, restored: Any, store: Any, kind: str, settings: dict
) -> md.MemoryHook:
  """The decoding hook of a memory setting over ``store``."""
  k = int(settings["k"])
  mem = s.of(ext_config.MtMemory)
  neighbours = mt_datastore.Neighbours(
      mt_datastore.searcher(store, md.metric_of(kind), mem, k), k
  )
  return md.MemoryHook(
      kind, settings, neighbours, k, int(restored.model.cfg.d_model)
  )


def mt_translate(run: spec.Run) -> dict:
  """``--mode=mt_translate``: beam search with the memory on a split."""
  s, workdir = run.settings, run.workdir
  t = s.of(task_config.Translation)
  kind = _kind(s)
  restored = _restore(run)
  store = mt_datastore.open_store(
      restored, mt_datastore.datastore_path(s, workdir)
  )
  settings = tuned_settings(s, workdir, kind)
  hook = make_hook(s, restored, store, kind, settings)
  split = t.split
  data = _split(s, restored, split)
  tr = parts.make_translator(
      t, restored.model, restored.variables, restored.vocab, hook=hook
  )
  scores = parts.score_split(
      tr,
      data,
      int(t.eval_max_sentences),
      f"decoding {split} with {kind} memory",
  )
  hyps = scores.pop("hypotheses")
  scores.update(settings=settings, search_seconds=hook.neighbours.seconds)
  path = paths.join(workdir, f"mt_translate_{kind}_{split}.json")
  paths.write_json(path, scores)
  out_txt = paths.join(workdir, "translations", f"{split}.{kind}.txt")
  paths.makedirs(paths.dirname(out_txt))
  with paths.open(out_txt, "w", encoding="utf-8") as f:
    f.write("\n".join(hyps) + "\n")
  console.info("wrote %s", out_txt)
  return {
      **scores,
      "results_path": path,
      "summary_lines": [bleu.summary(scores, f"{split} ({kind} memory)")],
  }


def retrieved_tokens(
    s: Settings,
    restored: Any,
    store: Any,
    sentences: Sequence[str],
    k: int = 4,
    metric: str = "dot_product",
) -> list[list[dict[str, Any]]]:
  """What the memory returns along each sentence's greedy translation.

  One translator and one searcher serve every sentence; the translations
  run teacher-forced together.

  Args:
    s: the run's settings (with ``mt_memory``).
    restored: the run (``memjax.run.restore.restore``).
    store: its datastore (``mt_datastore.open_store``).
    sentences: source sentences.
    k: neighbours shown per position.
    metric: 'dot_product' (TRIMEMT_ext) or 'squared_l2' (kNN-MT).

  Returns:
    Per sentence, per target position: {'token': the translation's piece
    there, 'retrieved': the k nearest entries' tokens, 'scores': their
    scores} (empty for a pair longer than the longest bucket).
  """
  from memjax.data import parallel  # pylint: disable=g-import-not-at-top
  from memjax.memory import search as search_lib  # pylint: disable=g-import-not-at-top

  tr = parts.make_translator(
      s.of(task_config.Translation),
      restored.model,
      restored.variables,
      restored.vocab,
  )
  srcs = [tr.encode(sentence) for sentence in sentences]
  # One at a time: the length limit depends on the batch's source length.
  ids = [
      np.asarray(tr.translate_ids([src], beam_size=1)[0] + [1], np.int32)
      for src in srcs
  ]  # + EOS
  split = parallel.ParallelSplit(list(sentences), [""] * len(ids), srcs, ids)
  near = mt_datastore.Neighbours(search_lib.ExactSearcher(store, metric), k)
  piece = lambda i: restored.vocab.decode([int(i)]) or "</s>"  # noqa: E731
  found: list[list[dict[str, Any]]] = [[] for _ in sentences]
  for out in mt_datastore.teacher_forced(s, restored, split):
    t = out["positions"].shape[1]
    for row, first in enumerate(out["positions"][:, 0]):
      if first < 0:  # a filling row
        continue
      i = int(first) // t  # positions are pair index * T + t
      scores, values = near(out["g"][row][: len(ids[i])])
      found[i] = [
          {
              "token": piece(tok),
              "retrieved": [piece(v) for v in vals],
              "scores": [float(x) for x in sc],
          }
          for tok, vals, sc in zip(ids[i], values, scores)
      ]
  return found
