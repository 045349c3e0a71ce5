"""``--mode=position_loss``: mean loss by position within a document.

The early-token analysis of Komatsuzaki (2021, Appendix 6.3.4): a token's
position is its offset in its document (the first token, not predicted, is
0), and the loss of each split is averaged in buckets of positions (1-16,
17-64, 65-256, 257+ by default, ``position_loss.buckets``). The context is
reset at document boundaries: each document is scored on its own with the
sliding windows of ``eval.window_len`` / ``eval.score_len`` (Baevski & Auli),
so no window crosses into the previous document. Documents are the corpus's
articles or, with ``position_loss.documents = 'sections'``, the article
sections too (a line ``= = Heading = =`` starts a new one), so the five demo
test articles give enough documents.

How a document is scored follows the model, not its name
(``document_scorer``):

* a model that carries memory (``model.carries_memory()``: Transformer-XL,
  LaMemo) reads each document as one lane from an empty memory, in segments
  of ``eval.segment_len`` (default ``data.seq_len``) with its memory
  (``eval.mem_len``, default ``model.mem_len``) carried within the document;
* with ``position_loss.memory = 'eval'``, a windowed model reads its
  evaluation memory as ``--mode=memeval`` and ``memjax.load(...).score``
  do (``tune.json``'s setting, else ``eval_memory``; e.g. ``knn``, the
  kNN-LM, with its datastore), each document its own stream, so a kNN-LM
  row is the LM's run scored with ``--config.eval_memory.kind=knn``;
* otherwise the model alone on the windows (the MARGE model with retrieval
  off, so its row measures what its weights learnt).

Writes ``<workdir>/position_loss.json`` and ``position_loss.png``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax.eval import memory_grid as em_lib
from memjax import experiment
from memjax.eval import streams as recurrent_eval
from memjax import registry
from memjax.eval import external as external_lib
from memjax import runfiles
from memjax import sharding as sharding_lib
from memjax.data import windows

BUCKETS = (1, 17, 65, 257)  # bucket lower bounds: 1-16, 17-64, 65-256, 257+
DOCUMENTS = ("articles", "sections")
MEMORIES = ("none", "eval")
# (tokens [N], spans [D, 2]) -> (positions [P], nll [P]) of every scored
# prediction of the documents.
DocumentScorer = Callable[
    [np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]
]


def bucket_labels(bounds: Sequence[int]) -> list[str]:
  """['1-16', '17-64', ..., '257+'] for lower bounds (1, 17, ..., 257)."""
  hi = [f"-{b - 1}" for b in bounds[1:]] + ["+"]
  return [f"{a}{h}" for a, h in zip(bounds, hi)]


def section_starts(tokens: np.ndarray, eq_id: int, eos_id: int) -> np.ndarray:
  """Offsets of lines starting '= =' (section headings), after an EOS."""
  t = np.asarray(tokens)
  i = np.flatnonzero((t[1:-1] == eq_id) & (t[2:] == eq_id) & (t[:-2] == eos_id))
  return i + 1


def document_spans(
    num_tokens: int, doc_starts: np.ndarray, extra: np.ndarray = ()
) -> np.ndarray:
  """[D, 2] (start, end) of the documents cut at ``doc_starts`` and
  ``extra`` (sorted, de-duplicated; empty documents dropped)."""
  cuts = np.unique(np.concatenate([[0], doc_starts, extra, [num_tokens]]))
  cuts = cuts[(cuts >= 0) & (cuts <= num_tokens)].astype(np.int64)
  spans = np.stack([cuts[:-1], cuts[1:]], axis=1)
  return spans[spans[:, 1] - spans[:, 0] >= 2]


def position_windows(
    tokens: np.ndarray, spans: np.ndarray, window_len: int, score_len: int
) -> dict[str, np.ndarray]:
  """Sliding windows inside each document, padded to ``window_len``.

  Returns:
    inputs, targets [W, window_len] int32; weights [W, window_len] float32
    (1 where scored); positions [W, window_len] int64 (the predicted
    token's offset in its document, 0 where not scored).
  """
  rows = []
  for a, b in spans:
    for s, n, f in windows.eval_windows(int(b - a - 1), window_len, score_len):
      rows.append((a + s, n, f, s))
  w = len(rows)
  out = dict(
      inputs=np.zeros((w, window_len), np.int32),
      targets=np.zeros((w, window_len), np.int32),
      weights=np.zeros((w, window_len), np.float32),
      positions=np.zeros((w, window_len), np.int64),
  )
  for r, (start, n, f, offset) in enumerate(rows):
    out["inputs"][r, :n] = tokens[start : start + n]
    out["targets"][r, :n] = tokens[start + 1 : start + n + 1]
    out["weights"][r, f:n] = 1.0
    out["positions"][r, f:n] = offset + np.arange(f, n) + 1
  return out


def bucket_means(
    positions: np.ndarray, nll: np.ndarray, bounds: Sequence[int]
) -> list[dict[str, Any]]:
  """Mean nll per bucket of positions (positions 0 are not scored)."""
  b = np.searchsorted(np.asarray(bounds), positions, side="right") - 1
  out = []
  for i, label in enumerate(bucket_labels(bounds)):
    m = (b == i) & (positions > 0)
    n = int(m.sum())
    out.append(
        dict(bucket=label, tokens=n, nll=float(nll[m].mean()) if n else None)
    )
  return out


def score_windows(restored: Any, batch: dict[str, np.ndarray], size: int):
  """Per-token nll [W, L] of ``restored``'s model on the windows."""
  model = restored.model
  fn = sharding_lib.under_mesh(
      jax.jit(
          lambda p, x, y: -model.apply(
              {"params": p}, x, y, deterministic=True
          ).target_logprob
      ),
      restored.mesh,
  )
  w = batch["inputs"].shape[0]
  out = []
  for a in range(0, w, size):
    x, y = batch["inputs"][a : a + size], batch["targets"][a : a + size]
    pad = size - len(x)
    if pad:
      x = np.concatenate([x, np.zeros((pad, x.shape[1]), x.dtype)])
      y = np.concatenate([y, np.zeros((pad, y.shape[1]), y.dtype)])
    nll = np.asarray(fn(restored.params, jnp.asarray(x), jnp.asarray(y)))
    out.append(nll[: size - pad])
  return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def document_segments(
    tokens: np.ndarray, spans: np.ndarray, segment_len: int, lanes: int
) -> dict[str, np.ndarray]:
  """The documents as lanes, each cut into segments of ``segment_len``.

  Args:
    tokens: [N] the stream.
    spans: [D, 2] (start, end) of at most ``lanes`` documents.
    segment_len: L, predictions per segment.
    lanes: lanes of the result (documents first, then empty lanes).

  Returns:
    inputs, targets [S, lanes, L] int32; weights [S, lanes, L] float32;
    positions [S, lanes, L] int64 (offset of the predicted token in its
    document, 0 where not scored); reset [S, lanes] bool (True at segment 0:
    every document starts from an empty memory).
  """
  n = np.maximum(spans[:, 1] - spans[:, 0] - 1, 0)
  s = max(1, int(-(-n.max() // segment_len))) if len(n) else 1
  shape = (lanes, s * segment_len)
  x, y = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
  w, pos = np.zeros(shape, np.float32), np.zeros(shape, np.int64)
  for d, ((a, _), m) in enumerate(zip(spans, n)):
    x[d, :m], y[d, :m] = tokens[a : a + m], tokens[a + 1 : a + m + 1]
    w[d, :m], pos[d, :m] = 1.0, np.arange(1, m + 1)
  lane_major = lambda v: np.swapaxes(v.reshape(lanes, s, segment_len), 0, 1)
  reset = np.zeros((s, lanes), bool)
  reset[0] = True
  return dict(
      inputs=lane_major(x), targets=lane_major(y), weights=lane_major(w),
      positions=lane_major(pos), reset=reset,
  )  # fmt: skip


def carried_scorer(config: Any, restored: Any) -> DocumentScorer:
  """Scores documents with the model's memory carried within each one
  (``eval.batch_size`` documents at a time, one compiled scan)."""
  ev = recurrent_eval.StreamEvaluator(
      restored.model,
      restored.mesh,
      segment_len=recurrent_eval.segment_len_of(config),
      mem_len=recurrent_eval.mem_len_of(config),
      lanes=max(1, int(config.eval.batch_size)),
  )
  ev.keep_tokens = True

  def score(tokens, spans):
    pos, nll = [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    for a in range(0, len(spans), ev.lanes):
      segs = document_segments(
          tokens, spans[a : a + ev.lanes], ev.segment_len, ev.lanes
      )
      positions = segs.pop("positions")
      out = ev.run_segments(restored.params, segs)
      # [S, lanes, L] -> [lanes, S, L]: documents in order.
      doc_major = lambda v: np.swapaxes(np.asarray(v)[:, : ev.lanes], 0, 1)
      scored = doc_major(segs["weights"]) > 0
      pos.append(doc_major(positions)[scored])
      nll.append(-doc_major(out["logprob"])[scored])
    return np.concatenate(pos), np.concatenate(nll)

  return score


def window_scorer(config: Any, restored: Any) -> DocumentScorer:
  """Scores the model alone on sliding windows inside each document."""
  e = config.eval

  def score(tokens, spans):
    batch = position_windows(tokens, spans, e.window_len, e.score_len)
    if e.max_windows:
      batch = {k: v[: e.max_windows] for k, v in batch.items()}
    nll = score_windows(restored, batch, e.batch_size)
    scored = batch["weights"] > 0
    return batch["positions"][scored], nll[scored]

  return score


def memory_scorer(
    config: Any, restored: Any, setting: dict[str, Any], external: Any
) -> DocumentScorer:
  """Scores each document as its own stream with the evaluation memory
  ``setting`` (``evaluate_memory.score_stream``; ``external``: the
  ``memory.external.ExternalSearch`` of a kind that reads one, else None)."""
  grid = em_lib.grid_of(setting)
  e, em = config.eval, config.eval_memory
  compiled = {}  # one compilation for all the documents

  def score(tokens, spans):
    pos, nll = [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    for a, b in spans:
      r = em_lib.score_stream(
          restored.model, restored.params, tokens[a:b], grid,
          window_len=e.window_len, score_len=e.score_len,
          batch_size=em.batch_size, mesh=restored.mesh, unit=restored.unit,
          block_size=int(em.block_size) or None, keep_tokens=True,
          desc=f"position_loss {grid.kind}", external=external,
          compiled=compiled,
      )  # fmt: skip
      lp = r["grid_logprob"][0] if "grid_logprob" in r else r["lm_logprob"]
      pos.append(np.arange(1, b - a, dtype=np.int64))
      nll.append(-np.asarray(lp, np.float32))
    return np.concatenate(pos), np.concatenate(nll)

  return score


def document_scorer(
    config: Any, restored: Any, workdir: str, memory: str
) -> DocumentScorer:
  """How the run's documents are scored (see the module docstring)."""
  if restored.model.carries_memory():
    if memory == "eval":
      raise errors.ConfigError(
          "position_loss.memory 'eval' reads an evaluation memory over "
          "sliding windows; this model carries its own memory (scored with "
          "it already): set position_loss.memory to 'none'"
      )
    return carried_scorer(config, restored)
  if memory == "none":
    return window_scorer(config, restored)
  from memjax import api  # pylint: disable=g-import-not-at-top

  setting = api.memory_setting(restored)
  kind = registry.EVAL_MEMORIES.get(setting["kind"])
  external = None
  if kind.external_metric:
    loaded = em_lib.Loaded(
        config, restored.mesh, restored.model, restored.params,
        restored.vocab_size, None, {}, restored.unit, restored.step,
        restored.path, workdir,
    )  # fmt: skip
    external = external_lib.external_search(loaded, kind.external_metric)
  return memory_scorer(config, restored, setting, external)


def memory_of(config: Any) -> str:
  """``position_loss.memory``: 'none' (default) or 'eval'."""
  memory = dict(config.get("position_loss") or {}).get("memory", "none")
  if memory not in MEMORIES:
    raise errors.ConfigError(
        f"position_loss.memory must be one of {MEMORIES}, got {memory!r}"
    )
  return memory


def _settings(config: Any) -> tuple[str, tuple[int, ...]]:
  opts = dict(config.get("position_loss") or {})
  documents = opts.get("documents", "articles")
  bounds = tuple(int(b) for b in opts.get("buckets", BUCKETS))
  if documents not in DOCUMENTS:
    raise errors.ConfigError(
        f"position_loss.documents must be one of {DOCUMENTS}, got "
        f"{documents!r}"
    )
  memory_of(config)
  if not bounds or bounds[0] != 1 or list(bounds) != sorted(set(bounds)):
    raise errors.ConfigError(
        f"position_loss.buckets must rise from 1, got {bounds}"
    )
  return documents, bounds


def position_loss(config: Any, workdir: str) -> dict[str, Any]:
  """``--mode=position_loss``: the loss by position table and plot."""
  documents, bounds = _settings(config)
  restored, corpus = experiment.load_for_mode(config, workdir)
  memory = memory_of(config)
  scorer = document_scorer(config, restored, workdir, memory)
  results: dict[str, Any] = dict(
      documents=documents,
      step=restored.step,
      checkpoint=restored.path,
      memory=memory,
  )
  for split, stream in corpus.splits.items():
    tokens = np.asarray(stream.tokens)
    extra = np.zeros(0, np.int64)
    if documents == "sections":
      vocab = restored.vocab
      extra = section_starts(tokens, vocab.token_to_id("="), vocab.eos_id)
    spans = document_spans(len(tokens), stream.doc_starts, extra)
    rows = bucket_means(*scorer(tokens, spans), bounds)
    results[split] = dict(documents=len(spans), buckets=rows)
    print(f"{split}: {len(spans)} {documents}")
    for r in rows:
      nll_ = "-" if r["nll"] is None else f"{r['nll']:.4f}"
      print(f"  positions {r['bucket']:>8}: nll {nll_} ({r['tokens']} tokens)")
  paths = [os.path.join(workdir, f"position_loss.{x}") for x in ("json", "png")]
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    runfiles.write_json(paths[0], results)
    plot(results, paths[1])
  return dict(results, files=paths)


def plot(results: dict[str, Any], path: str) -> None:
  """Mean nll by position bucket, one line per split."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(5, 3.2))
  for split, r in results.items():
    if not isinstance(r, dict) or "buckets" not in r:
      continue
    rows = [b for b in r["buckets"] if b["nll"] is not None]
    ax.plot([b["bucket"] for b in rows], [b["nll"] for b in rows], "o-",
            label=split)  # fmt: skip
  ax.set_xlabel("position in document")
  ax.set_ylabel("mean loss (nats)")
  ax.set_title(f"loss by position ({results['documents']})")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
