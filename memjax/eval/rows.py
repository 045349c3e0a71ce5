"""Rows of model inputs in padded batches, and the scorer every kind builds on.

The one padded-batch helper: ``row_batches`` cuts rows (windows, masked
windows, sentences, retrieval windows) into batches of one size, rounded up
to a multiple of the data-parallel devices, fills the last batch with
all-zero rows (zero weights; a padding id 0 reads no memory slot in the
encoder) and puts each on the mesh. ``Scorer.rows`` runs the model over
them, jitted once per shape through ``sharding.jit`` (the one place a
function is jitted for the mesh), and returns the sums and per-row outputs
the caller asks for. The stream scorers (``windows``, ``streams``,
``memory_grid``) subclass ``Scorer``; ``memjax.eval.scorer_for`` picks one.
``Scoring`` is what every scorer is given (``memjax.run.spec.Run.scoring``
makes one).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from memjax import extend
from memjax import settings as settings_lib
from memjax import sharding as sharding_lib
from memjax.eval import metrics
from memjax.models import variables as model_vars


@dataclasses.dataclass(frozen=True)
class Scoring:
  """What a scorer needs: a model and the settings it is scored with.

  Attributes:
    model: the model.
    mesh: the device mesh.
    unit: 'ppl' or 'bpc'.
    eval: the evaluation settings (windows, batch size, lanes).
    memory: the ``eval_memory`` settings.
    sections: every settings section of the run (``Settings.sections``),
      where a memory kind's axes read their own keys (``evaluation.Axis``).
    memories: the evaluation memories by name.
    extra_inputs: the batch arrays the model takes besides inputs and
      targets (``extend.Family.extra_inputs``).
    segment_len: a recurrent model's evaluation segment length.
    mem_len: its evaluation memory length.
    path: the run or export the parameters come from (its ``tune.json``
      and datastore).
    sum_reports: the per-slot sums collected (``variables.SumReport``).
    signature: the model's signature (a datastore built from it must
      match it).
    step: the training step of the parameters scored.
    datastore_corpus: ``datastore.corpus``: a datastore of another corpus
      is ``datastore-<corpus>`` in the workdir.
    window_bos: the BOS id windows starting inside a document begin with
      (``data.windows.begin_with_bos``): the one an imported tokenizer puts
      before each document; None for memjax's own vocabularies.
  """

  model: Any
  mesh: Mesh
  unit: str = "ppl"
  eval: settings_lib.Eval = settings_lib.Eval()
  memory: settings_lib.EvalMemory = settings_lib.EvalMemory()
  sections: Mapping[type, Any] = dataclasses.field(default_factory=dict)
  memories: Optional[extend.Lookup[Any]] = None
  extra_inputs: tuple[str, ...] = ()
  segment_len: int = 0
  mem_len: int = 0
  path: str = ""
  sum_reports: tuple[Any, ...] = ()
  signature: Optional[Mapping[str, Any]] = None
  step: int = 0
  datastore_corpus: str = ""
  window_bos: Optional[int] = None


def data_parallel(mesh: Mesh) -> int:
  """Devices a batch is split over (``sharding.BATCH_AXES``)."""
  return sharding_lib.data_parallel(mesh)


def batch_rows(batch_size: int, mesh: Mesh) -> int:
  """``batch_size`` rounded up to a multiple of the data-parallel devices."""
  dp = data_parallel(mesh)
  return int(math.ceil(max(int(batch_size), 1) / dp) * dp)


def pad_rows(arrays: Mapping[str, np.ndarray], rows: int) -> dict:
  """Each array of ``arrays`` [n, ...] padded with zeros to [rows, ...]."""
  out = {}
  for k, v in arrays.items():
    v = np.asarray(v)
    fill = np.zeros((rows - len(v),) + v.shape[1:], v.dtype)
    out[k] = np.concatenate([v, fill]) if len(fill) else v
  return out


def row_batches(
    arrays: Mapping[str, np.ndarray],
    batch_size: int,
    mesh: Mesh,
    drop_remainder: bool = False,
) -> Iterator[tuple[dict[str, np.ndarray], int]]:
  """(padded host batch, real rows) of ``arrays`` [N, ...] in batches.

  Args:
    arrays: equal-length arrays, one row per example.
    batch_size: rows per batch (rounded up to the data-parallel devices).
    mesh: the device mesh.
    drop_remainder: leave out a last batch that is not full instead of
      padding it (where padding rows would be counted).
  """
  size = batch_rows(batch_size, mesh)
  n = len(next(iter(arrays.values())))
  for first in range(0, n, size):
    part = {k: np.asarray(v[first : first + size]) for k, v in arrays.items()}
    real = len(next(iter(part.values())))
    if real < size and drop_remainder:
      return
    yield pad_rows(part, size), real


def add_up(total: Any, got: Any) -> Any:
  """``total + got`` leaf by leaf in float64 (``total`` None: ``got``)."""
  got = jax.tree.map(lambda x: np.asarray(x, np.float64), got)
  return got if total is None else jax.tree.map(np.add, total, got)


class Scorer:
  """Runs a run's model over rows or streams; one compilation per shape.

  Subclasses score token streams the way the model is meant to be scored
  (``score``, ``stream_logprobs``, ``document_logprobs``); every kind runs
  the model over given rows with ``rows``.
  """

  def __init__(self, scoring: Scoring) -> None:
    self.scoring = scoring
    self.model = scoring.model
    self.mesh = scoring.mesh
    self.unit = scoring.unit
    # The jitted functions kept between calls, by what they compute.
    self.compiled: dict[Any, Any] = {}

  # -- streams (the subclasses) ------------------------------------------

  def score(
      self, params: Any, tokens: np.ndarray, max_items: int = 0, desc: str = ""
  ) -> dict[str, float]:
    """{'nll', 'tokens', 'ppl' | 'bpc'} and 'aux/<path>' (the mean of each
    statistic the modules report) of one token stream [N], over its first
    ``max_items`` windows or segments per lane (0 = all)."""
    start = time.time()
    nll_sum, count, aux = self.stream_sums(params, tokens, max_items, desc)
    res = metrics.summarize(nll_sum, count, self.unit)
    metrics.with_stats(res, aux)
    metrics.log(desc or "eval", res, start, self.describe())
    return res

  def stream_sums(
      self, params: Any, tokens: np.ndarray, max_items: int, desc: str
  ) -> tuple[float, float, dict[str, Any]]:
    """(summed NLL, predictions, {path: [..., 2]} module statistics) of a
    stream (the kinds' ``score``)."""
    raise TypeError(self._rows_only())

  def describe(self) -> str:
    """How the scorer reads a stream, for the progress line ('' = plainly)."""
    return ""

  def stream_logprobs(self, params: Any, tokens: np.ndarray) -> np.ndarray:
    """[N - 1] float32 log p of every token of a stream [N] after its
    first, scored as ``score`` scores it."""
    raise TypeError(self._rows_only())

  def _rows_only(self) -> str:
    return (
        f"{type(self).__name__} runs batches of rows only; streams are scored"
        " by the scorer that eval.scorer.scorer_for(run) picks"
    )

  def document_logprobs(
      self,
      params: Any,
      tokens: np.ndarray,
      spans: np.ndarray,
      max_items: int = 0,
  ) -> list[np.ndarray]:
    """Per document ([D, 2] (start, end) spans of ``tokens``) the float32 log
    p of its tokens after its first, each document read from an empty
    context (here: each its own stream; kinds batch documents together);
    ``max_items`` (windows, where the kind counts them) may cut the last
    documents short or leave them out."""
    del max_items  # Documents are read whole.
    return [self.stream_logprobs(params, tokens[a:b]) for a, b in spans]

  # -- rows ----------------------------------------------------------------

  def rows(
      self,
      params: Any,
      arrays: Mapping[str, np.ndarray],
      *,
      batch_size: Optional[int] = None,
      keep: Sequence[str] = (),
      collections: Sequence[str] = (),
      drop_remainder: bool = False,
  ) -> dict[str, Any]:
    """The model over rows of inputs, in padded batches (``row_batches``).

    Args:
      params: the parameters.
      arrays: 'inputs' [N, L] and, optionally, 'targets' [N, L] (then the
        target log-probabilities are summed), 'weights' [N, L] and the
        model's extra inputs (e.g. MARGE's 'sources', 'source_mask');
        other keys are ignored.
      batch_size: rows per batch (default ``eval.batch_size``).
      keep: output fields returned per row, e.g. 'target_logprob' [N, L]
        or 'logits' [N, C].
      collections: Flax collections the modules sow into, summed over the
        batches (e.g. a memory layer's per-slot read counts).
      drop_remainder: leave out a last partial batch instead of padding it.

    Returns:
      See ``apply``; N' = N, or the rows of the full batches with
      ``drop_remainder``.
    """
    size = batch_size or int(self.scoring.eval.batch_size)
    batches = row_batches(arrays, size, self.mesh, drop_remainder)
    return self.apply(params, batches, keep=keep, collections=collections)

  def apply(
      self,
      params: Any,
      batches: Iterable[tuple[Mapping[str, np.ndarray], int]],
      *,
      keep: Sequence[str] = (),
      collections: Sequence[str] = (),
  ) -> dict[str, Any]:
    """The model over host batches made by the caller (e.g. each padded to
    its own length bucket), one compilation per shape.

    Args:
      params: the parameters.
      batches: (arrays as in ``rows``, [B, ...] with B a multiple of the
        data-parallel devices; real rows: the first ones, kept in outputs).
      keep: output fields returned per real row.
      collections: Flax collections summed over the batches.

    Returns:
      'nll_sum' and 'tokens' (for batches with targets; weights default to
      1), each name of ``keep`` [N', ...] over the real rows and each of
      ``collections`` (a pytree of float64 sums, {} when nothing was sown).
    """
    extra = tuple(self.scoring.extra_inputs)
    names = set(extra) | {"inputs", "targets", "weights"}
    total, kept = None, {k: [] for k in keep}
    for arrays, real in batches:
      batch = {k: v for k, v in arrays.items() if k in names}
      fn = self._rows_fn(tuple(sorted(batch)), tuple(keep), tuple(collections))
      sums, per_row = jax.device_get(
          fn(params, sharding_lib.put_global_batch(batch, self.mesh))
      )
      total = add_up(total, sums)
      for k in keep:
        kept[k].append(np.asarray(per_row[k])[:real])
    out = dict(total or {})
    out.update({k: np.concatenate(v) for k, v in kept.items() if v})
    for name in collections:
      out[name] = out.get(name) or {}
    return out

  def _rows_fn(self, names: tuple, keep: tuple, collections: tuple) -> Any:
    """The jitted forward of ``apply`` for batches with keys ``names``."""
    key = ("rows", names, keep, collections)
    if key not in self.compiled:
      model, names_in = self.model, tuple(self.scoring.extra_inputs)

      def fn(params, batch):
        extra = {k: batch[k] for k in names_in if k in batch}
        out, state = model.apply(
            model_vars.as_variables(params),
            batch["inputs"],
            batch.get("targets"),
            mutable=list(collections),
            **extra,
        )
        sums = {c: state.get(c, {}) for c in collections}
        if "targets" in batch:
          w = batch.get("weights", jnp.ones(batch["targets"].shape))
          sums["nll_sum"] = -jnp.sum(out.target_logprob * w)
          sums["tokens"] = jnp.sum(w)
        return sums, {k: getattr(out, k) for k in keep}

      self.compiled[key] = sharding_lib.jit(fn, self.mesh)
    return self.compiled[key]
