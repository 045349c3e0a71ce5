"""Evaluation of recurrent-memory models over whole streams.

A model that carries memory (Transformer-XL, LaMemo) is evaluated the way it
is trained: the split's stream is cut into ``lanes`` contiguous lanes
(``windows.SegmentStream``), and ``jax.lax.scan`` runs the model over the
consecutive segments of every lane, carrying the memory from one segment to
the next. Every prediction is scored exactly once, with the memory of the
segments before it in its lane. The segment length and the memory length may
differ from training (``eval.segment_len``, ``eval.mem_len``): no parameter
depends on either.

The scan runs in chunks of ``chunk`` segments (one compiled program; the
memory is carried from chunk to chunk), so long splits report progress.
Documents scored on their own (``document_logprobs``) are lanes of their
own, each starting from an empty memory.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from memjax.io import console
from memjax import errors
from memjax import sharding as sharding_lib
from memjax.models import variables as model_vars
from memjax.data import windows
from memjax.eval import rows

_KEYS = ("inputs", "targets", "weights", "reset")


def stacked_segments(
    tokens: np.ndarray, segment_len: int, lanes: int, max_segments: int = 0
) -> dict[str, np.ndarray]:
  """The split's segments in lanes, stacked: [S, lanes, L] arrays.

  Args:
    tokens: [N] token stream.
    segment_len: L.
    lanes: contiguous lanes the stream is cut into.
    max_segments: keep only the first this many segments of each lane
      (0 = all).

  Returns:
    'inputs', 'targets' int32, 'weights' float32 [S, lanes, L]; 'reset'
    [S, lanes] bool (True at segment 0).
  """
  stream = windows.SegmentStream(tokens, segment_len, lanes)
  stacked = stream.stacked()
  out = {k: stacked[k] for k in _KEYS}
  if max_segments:
    out = {k: v[:max_segments] for k, v in out.items()}
  return out


class StreamScorer(rows.Scorer):
  """Scores token streams with a recurrent model, carrying its memory.

  Compiles one scan over ``chunk`` segments per distinct shape; reuse a
  scorer across calls (periodic evaluation) to compile once.
  """

  def __init__(
      self,
      scoring: rows.Scoring,
      *,
      segment_len: Optional[int] = None,
      mem_len: Optional[int] = None,
      lanes: Optional[int] = None,
      chunk: int = 64,
  ):
    """Creates the scorer.

    Args:
      scoring: the model and its settings (``rows.Scoring``); its model
        carries memory.
      segment_len: L, predictions per segment (default the scoring's:
        ``eval.segment_len`` or ``data.seq_len``).
      mem_len: memory length M (default the scoring's: ``eval.mem_len`` or
        the model's).
      lanes: contiguous lanes per split (default ``eval.lanes``; padded with
        empty lanes to a multiple of the data-parallel size).
      chunk: segments per compiled scan.

    Raises:
      errors.ConfigError: the model carries no memory, or a length is not
        positive.
    """
    super().__init__(scoring)
    model = self.model
    if mem_len is None:
      mem_len = scoring.mem_len or model.cfg.mem_len
    mem_len = int(mem_len)
    if mem_len != model.cfg.mem_len:
      model = model.with_settings(mem_len=mem_len)
    if not model.carries_memory():
      raise errors.ConfigError(
          f"recurrent evaluation needs a model that carries memory (attention "
          f"'xl' or 'lamemo' with mem_len > 0); got attention "
          f"{model.cfg.attention!r}, mem_len {model.cfg.mem_len}"
      )
    if segment_len is None:
      segment_len = scoring.segment_len
    lanes = int(scoring.eval.lanes) if lanes is None else lanes
    if segment_len < 1 or lanes < 1 or chunk < 1:
      raise errors.ConfigError(
          f"eval segment_len, lanes and chunk must be >= 1; got {segment_len}, "
          f"{lanes}, {chunk}"
      )
    self.model = model
    self.segment_len = int(segment_len)
    self.mem_len = int(model.cfg.mem_len)
    self.lanes = int(lanes)
    self.padded_lanes = rows.batch_rows(self.lanes, self.mesh)
    self.chunk = int(chunk)
    # Also return per-prediction log-probabilities ([S, lanes, L]).
    self.keep_tokens = False

  def _step(
      self, params: Any, memory: Any, segment: dict[str, jax.Array]
  ) -> tuple[Any, dict[str, jax.Array]]:
    """One segment: [lanes, L] arrays -> (new memory, per-lane sums)."""
    memory = self.model.reset_memory(memory, segment["reset"])
    out, sums = model_vars.apply(
        self.model,
        model_vars.as_variables(params),
        segment["inputs"],
        segment["targets"],
        memory=memory,
        deterministic=True,
    )
    w = segment["weights"]
    res = {
        "nll_sum": -jnp.sum(out.target_logprob * w, axis=1),
        "tokens": jnp.sum(w, axis=1),
    }
    # Module statistics of the segment ([2] each; ``memjax.models.variables``).
    res.update({f"aux/{k}": v for k, v in sums.items()})
    if self.keep_tokens:
      res["logprob"] = out.target_logprob * w
    return out.memory, res

  def _scan(self) -> Any:
    """The jitted scan of ``_step`` over [chunk, lanes, L] segments."""
    key = ("scan", self.keep_tokens)
    if key not in self.compiled:

      def run_chunk(params, memory, segments):
        return jax.lax.scan(
            lambda m, s: self._step(params, m, s), memory, segments
        )

      self.compiled[key] = sharding_lib.jit(run_chunk, self.mesh)
    return self.compiled[key]

  def init_memory(self) -> Any:
    """An empty memory of the padded lanes, sharded over the data axes."""
    memory = self.model.init_memory(self.padded_lanes)
    shardings = jax.tree.map(
        lambda x: sharding_lib.batch_sharding(self.mesh, x.ndim), memory
    )
    return jax.device_put(memory, shardings)

  def _put(self, chunk: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    out = {}
    for k, v in chunk.items():
      spec = P(None, sharding_lib.BATCH_AXES, *([None] * (v.ndim - 2)))
      sharding = NamedSharding(self.mesh, spec)
      out[k] = jax.make_array_from_callback(
          v.shape, sharding, lambda idx, v=v: v[idx]
      )
    return out

  def _pad(
      self, segments: dict[str, np.ndarray]
  ) -> tuple[dict[str, np.ndarray], int]:
    """Pads lanes to ``padded_lanes`` and segments to a multiple of the
    chunk; returns (padded segments, chunk)."""
    num = segments["inputs"].shape[0]
    chunk = min(self.chunk, max(num, 1))
    total = int(math.ceil(num / chunk) * chunk) if num else 0
    out = {}
    for k, v in segments.items():
      pad = [(0, total - num), (0, self.padded_lanes - v.shape[1])]
      pad += [(0, 0)] * (v.ndim - 2)
      fill = True if k == "reset" else 0
      padded = np.pad(v, pad, constant_values=fill)
      if k == "reset":  # Padded segments continue their lanes.
        padded[num:] = False
        padded[:num, v.shape[1] :] = True
      out[k] = padded
    return out, chunk

  def run_segments(
      self, params: Any, segments: dict[str, np.ndarray], desc: str = ""
  ) -> dict[str, np.ndarray]:
    """Runs ``_step`` over stacked segments ([S, lanes, L]) from an empty
    memory; returns its outputs stacked: [S, ...] (padded lanes included)."""
    num, lanes = segments["inputs"].shape[:2]
    if lanes != self.lanes:
      raise ValueError(f"segments have {lanes} lanes, scorer {self.lanes}")
    padded, chunk = self._pad({k: segments[k] for k in _KEYS})
    memory = self.init_memory()
    scan = self._scan()
    results = []
    start = time.time()
    for i, first in enumerate(range(0, padded["inputs"].shape[0], chunk)):
      part = {k: v[first : first + chunk] for k, v in padded.items()}
      memory, outputs = scan(params, memory, self._put(part))
      results.append(outputs)
      if desc and i and i % 10 == 0:
        jax.block_until_ready(outputs)
        console.info(
            "%s: %d/%d segments, %.0fs",
            desc,
            first + chunk,
            num,
            time.time() - start,
        )
    fetched = jax.device_get(results)
    return {
        k: np.concatenate([np.asarray(r[k]) for r in fetched])[:num]
        for k in (fetched[0] if fetched else {})
    }

  def score_segments(
      self, params: Any, segments: dict[str, np.ndarray], desc: str = ""
  ) -> dict[str, np.ndarray]:
    """Scores stacked segments ([S, lanes, L], see ``stacked_segments``).

    Returns:
      {'nll_sum', 'tokens'}: [S, lanes] float64 sums per segment and lane;
      'aux/<path>': [S, 2] sums of the statistics the modules report
      (``memjax.models.variables``).
    """
    num, lanes = segments["inputs"].shape[:2]
    out = self.run_segments(params, segments, desc)
    res = {
        k: (
            np.asarray(out[k], np.float64)[:, :lanes]
            if out
            else np.zeros((num, lanes))
        )
        for k in ("nll_sum", "tokens")
    }
    res.update({k: v for k, v in out.items() if k.startswith("aux/")})
    return res

  def stream_sums(
      self, params: Any, tokens: np.ndarray, max_items: int, desc: str
  ) -> tuple[float, float, dict[str, Any]]:
    """The stream's sums over the first ``max_items`` segments of each lane
    (0 = the whole stream)."""
    segments = stacked_segments(tokens, self.segment_len, self.lanes, max_items)
    sums = self.score_segments(params, segments, desc)
    aux = {k[4:]: v for k, v in sums.items() if k.startswith("aux/")}
    return float(sums["nll_sum"].sum()), float(sums["tokens"].sum()), aux

  def describe(self) -> str:
    return (
        f"segments of {self.segment_len}, memory {self.mem_len}, "
        f"{self.lanes} lanes"
    )

  def _logprobs(self, params: Any, segments: dict[str, np.ndarray]):
    """log p [S, lanes, L] of stacked segments (the real lanes)."""
    keep, self.keep_tokens = self.keep_tokens, True
    try:
      out = self.run_segments(params, segments)
    finally:
      self.keep_tokens = keep
    return np.asarray(out["logprob"])[:, : self.lanes]

  def stream_logprobs(self, params: Any, tokens: np.ndarray) -> np.ndarray:
    """[N - 1] log p of a stream [N] after its first token, scored as
    ``score`` scores it (``lanes`` contiguous lanes, memory carried)."""
    if len(tokens) < 2:
      return np.zeros(0, np.float32)
    segments = stacked_segments(tokens, self.segment_len, self.lanes)
    # [S, lanes, L] -> lane-major, which is stream order (lanes are
    # contiguous pieces of the stream).
    lp = np.swapaxes(self._logprobs(params, segments), 0, 1)
    w = np.swapaxes(segments["weights"], 0, 1) > 0
    return lp.reshape(-1)[w.reshape(-1)].astype(np.float32)

  def document_logprobs(
      self,
      params: Any,
      tokens: np.ndarray,
      spans: np.ndarray,
      max_items: int = 0,
  ) -> list[np.ndarray]:
    """Per document, log p of its tokens after its first: the documents are
    lanes (``eval.batch_size`` side by side in one compiled scan), each from
    an empty memory, in segments of ``segment_len`` with the memory carried
    within the document."""
    del max_items  # Documents are read whole.
    group = self._document_lanes()
    out = []
    for a in range(0, len(spans), group.lanes):
      part = spans[a : a + group.lanes]
      segs = windows.document_segments(
          tokens, part, group.segment_len, group.lanes
      )
      # [S, lanes, L] -> [lanes, S, L]: documents in order.
      lp = np.swapaxes(group._logprobs(params, segs), 0, 1)  # pylint: disable=protected-access
      w = np.swapaxes(segs["weights"], 0, 1) > 0
      out += [lp[d][w[d]].astype(np.float32) for d in range(len(part))]
    return out

  def _document_lanes(self) -> "StreamScorer":
    """The scorer whose lanes are ``eval.batch_size`` documents (kept)."""
    size = self.scoring.eval.batch_size
    lanes = max(1, int(size or self.lanes))
    if lanes == self.lanes:
      return self
    if "documents" not in self.compiled:
      self.compiled["documents"] = StreamScorer(
          self.scoring,
          segment_len=self.segment_len,
          mem_len=self.mem_len,
          lanes=lanes,
          chunk=self.chunk,
      )
    return self.compiled["documents"]
