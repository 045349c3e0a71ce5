"""Key/value-cache decoding of the modified-MARGE LM, retrieving as
``--mode=marge_eval`` retrieves.

Evaluation scores S_{t+1} of a window S_t S_{t+1} (positions 0 .. 2N - 1)
with the K sources that e(S_t) retrieves from the training segments and
from the document's own S_0 .. S_{t-1}, each followed by its continuation
(``evaluation``). ``MargeDecoder`` follows a text in segments of N from
its first token:

* a query inside S_0 (stream position p < N - 1), whose next token
  evaluation never scores, reads S_0 with retrieval off (no source: the
  model's ``sources=None``);
* at p = (t + 1) N - 1, S_t is complete: its e(S_t) goes to the host
  (``jax.pure_callback``), where ``Retriever`` returns the K best of the
  run's index (every training segment embedded with the run's parameters,
  searched as ``marge.search`` says) and of the text's own past segments
  (their e kept beside the cache); the window then starts again: S_t runs
  at positions 0 .. N - 1 with those sources, its last query predicting
  S_{t+1}'s first token;
* every later query of the window is one cached step, at position
  N - 1 + r, with the window's sources.

Every row's text starts at the decoding's first step and its prompt is fed
one step at a time, so the rows of a batch change windows on the same
steps. The sources' encoding (the lower half of the stack) and their bias
beta e(S_t).e(source) are computed once per window.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax.methods.marge import retrieval
from memjax.models import decode_prompts
from memjax.models import lm_decoding
from memjax.models import variables as model_vars

Array = jax.Array


class Retriever:
  """The host's search for a window's sources (see the module doc).

  Attributes:
    index: the training segments and their embeddings
      (``retrieval.SegmentIndex``).
    k: K, sources per window.
  """

  def __init__(self, index: retrieval.SegmentIndex, k: int):
    self.index, self.k = index, int(k)

  @classmethod
  def of_run(cls, restored: Any, variables: Any) -> "Retriever":
    """The run's index: its training segments embedded with
    ``variables`` (as ``--mode=marge_eval`` embeds them).

    Raises:
      errors.ConfigError: the run's training corpus cannot be read.
    """
    # pylint: disable=g-import-not-at-top
    from memjax.data import corpus as corpus_lib
    from memjax.methods.marge import config as marge_config
    from memjax.methods.marge import reindex

    s = restored.settings
    try:
      train = corpus_lib.load_corpus(
          s.data, s.eval, restored.run.workdir, splits=(), train=True
      ).train
    except (errors.DataError, FileNotFoundError) as e:
      raise errors.ConfigError(
          "generate: MARGE retrieves from its run's training segments, "
          f"which cannot be read here ({e})"
      ) from e
    table = retrieval.table_of(s.model, train)
    model = restored.model
    emb = reindex.embed_all(
        model,
        variables,
        table.segment_tokens(np.arange(len(table))),
        256,
        restored.mesh,
    )
    search = s.of(marge_config.Marge).search
    return cls(retrieval.SegmentIndex(table, emb, search), model.num_sources)

  def sources(
      self, query: np.ndarray, own: np.ndarray, count: int, text: np.ndarray
  ) -> tuple[np.ndarray, np.ndarray]:
    """The K sources of each row's window.

    Args:
      query: [B, D] float32 e(S_t).
      own: [B, S, D] float32 e of the text's segments (rows < ``count``
        are its past, S_0 .. S_{t-1}).
      count: t.
      text: [B, L] int32 the text so far (row b's token i at column i).

    Returns:
      (sources [B, K, 2N] int32: segment then continuation, mask [B, K,
      2N] bool: True on a real token), best first, as evaluation's exact
      search over the training segments and the own past orders them.
    """
    table, n, k = self.index.table, self.index.table.segment_len, self.k
    query = np.asarray(query, np.float32)
    scores, ids = self._nearest(query)
    past = np.einsum("bd,bsd->bs", query, np.asarray(own)[:, :count])
    # Candidates: the training segments (ids >= 0), then the own past
    # (-1 - j for S_j); a stable sort keeps training first on a tie.
    cand = np.concatenate(
        [ids, -1 - np.arange(count)[None].repeat(len(ids), 0)], 1
    )
    score = np.concatenate([scores, past], 1)
    order = np.argsort(-score, axis=1, kind="stable")[:, :k]
    picked = np.take_along_axis(cand, order, 1)
    out = np.zeros((len(query), k, 2 * n), np.int32)
    mask = np.zeros(out.shape, bool)
    for b, row in enumerate(picked):
      for i, c in enumerate(row):
        if c >= 0:
          out[b, i, :n], mask[b, i, :n] = table.segment_tokens(c), True
          if table.next[c] >= 0:
            out[b, i, n:] = table.segment_tokens(table.next[c])
            mask[b, i, n:] = True
        else:  # S_j and its continuation S_{j + 1}, both complete.
          j = -1 - int(c)
          out[b, i] = text[b, j * n : (j + 2) * n]
          mask[b, i] = True
    return out, mask

  def _nearest(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scores [B, K] float32, segment ids [B, K]) of the K best training
    segments. Exact search runs in NumPy here, not through
    ``search.exact_topk``'s JAX program: this runs inside a compiled
    decoding step (a host callback), where launching JAX work can wait
    forever on the devices that wait for it."""
    if self.index.search != "exact":
      return self.index.nearest(query, self.k)
    k = min(self.k, len(self.index.table))
    scores = query @ self.index.emb.T
    ids = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, ids, 1), ids


class MargeDecoder(lm_decoding.CachedDecoder):
  """Cached decoding of a MARGE LM (see the module doc). Its state's
  context: (the text [B, L], e of its segments [B, S, D], the window's
  cross-attention inputs)."""

  def __init__(self, model, reader=None, segment_len=0, windows=None):
    del segment_len, windows  # MARGE's windows are its segments'.
    if reader is not None:
      raise errors.ConfigError(
          "generate with an evaluation memory: MARGE reads its retrieved "
          "sources; set generate.memory=False"
      )
    super().__init__(model)
    self.n = int(model.segment_len)
    self.retriever: Optional[Retriever] = None

  def prepare_run(self, restored: Any, variables: Any) -> None:
    """The run's mesh, and its index (``Retriever.of_run``) once."""
    super().prepare_run(restored, variables)
    if self.retriever is None:
      self.retriever = Retriever.of_run(restored, variables)

  def describe(self) -> str:
    k = self.model.num_sources
    return (
        f", windows of {2 * self.n} from the text's start, {k} sources "
        "retrieved per window"
    )

  def init_cache(self, batch: int, length: int) -> tuple:
    """The window's keys and values: 2N slots per layer."""
    del length
    return super().init_cache(batch, 2 * self.n)

  def _cross(self, mdl, query, sources, mask) -> dict[str, Array]:
    """The window's cross-attention inputs from its sources."""
    enc, e_src = mdl.encode_sources(sources)
    return dict(
        sources=enc,
        source_mask=mask,
        bias=mdl.similarity_bias(query, e_src),
    )

  def _run(self, params, cache, tokens, slot, cross):
    """[B, Q] tokens at slots slot .. (positions the same) -> ([B, V]
    log-probs of the last, cache)."""
    q = tokens.shape[1]
    positions = slot + jnp.arange(q)[None, :].repeat(tokens.shape[0], 0)
    mask = jnp.ones((tokens.shape[0], 1, 1, 2 * self.n), bool)

    def fn(mdl):
      h, _, new = lm_decoding._forward(  # pylint: disable=protected-access
          mdl, tokens, positions, mask, slot, cache, cross
      )
      return mdl.log_probs(h[:, -1]), new

    return self.model.apply(model_vars.as_variables(params), method=fn)

  def _start(self, params, context, t):
    """Window t's start: S_t's sources, then S_t again at slots 0 ..
    N - 1. -> (log-probs, cache, context)."""
    text, own, _ = context
    b, n = text.shape[0], self.n
    seg = jax.lax.dynamic_slice_in_dim(text, t * n, n, axis=1)
    variables = model_vars.as_variables(params)
    query = self.model.apply(
        variables, seg, method=lambda mdl, x: mdl.embed_segments(x)
    )
    k = self.model.num_sources
    shapes = (
        jax.ShapeDtypeStruct((b, k, 2 * n), jnp.int32),
        jax.ShapeDtypeStruct((b, k, 2 * n), jnp.bool_),
    )
    sources, mask = jax.pure_callback(
        lambda q, o, c, x: self.retriever.sources(q, o, int(c), np.asarray(x)),
        shapes,
        query,
        own,
        t,
        text,
        vmap_method="sequential",
    )
    own = jax.lax.dynamic_update_slice_in_dim(own, query[:, None], t, axis=1)
    cross = self.model.apply(
        variables, query, sources, mask, method=self._cross
    )
    cache = super().init_cache(b, 2 * n)
    logp, cache = self._run(params, cache, seg, 0, cross)
    return logp, cache, (text, own, cross)

  def _empty_cross(self, b: int) -> dict[str, Array]:
    """No source (retrieval off)."""
    cfg, k = self.model.cfg, self.model.num_sources
    return dict(
        sources=jnp.zeros((b, k, 2 * self.n, cfg.d_model), cfg.compute_dtype),
        source_mask=jnp.zeros((b, k, 2 * self.n), bool),
        bias=jnp.zeros((b, k), jnp.float32),
    )

  @functools.partial(jax.jit, static_argnums=(0, 5))
  def prefill(self, params, tokens, positions, key_valid, length):
    """The rows' first tokens [B, 1] -> ([B, V] log-probabilities, cache,
    context)."""
    del positions
    b, segments = tokens.shape[0], -(-length // self.n) + 1
    text = jnp.zeros((b, key_valid.shape[1]), jnp.int32)
    text = text.at[:, 0].set(tokens[:, 0])
    own = jnp.zeros((b, segments, self.model.cfg.d_model), jnp.float32)
    context = (text, own, self._empty_cross(b))
    return self._step_at(params, self.init_cache(b, 0), context, 0)

  def _step_at(self, params, cache, context, p):
    """The query at stream position p (its token already in the text):
    a window's start, else one cached step at its slot in S_0 (retrieval
    off: ``context``'s cross inputs are empty there) or in S_{t+1}."""
    n = self.n
    text, _, cross = context

    def cached():
      slot = jnp.where(p < n - 1, p, n - 1 + (p + 1) % n)
      token = jax.lax.dynamic_slice_in_dim(text, p, 1, axis=1)
      logp, new = self._run(params, cache, token, slot, cross)
      return logp, new, context

    return jax.lax.cond(
        (p + 1) % n == 0,  # S_t complete: window t starts.
        lambda: self._start(params, context, (p + 1) // n - 1),
        cached,
    )

  def step(self, params, cache, context, token, position, key_valid, slot):
    """[B] tokens at stream ``position`` (the same for every row) ->
    ([B, V] log-probs, cache, context)."""
    del key_valid, slot
    p = position[0]
    text = jax.lax.dynamic_update_slice_in_dim(
        context[0], token[:, None].astype(jnp.int32), p, axis=1
    )
    return self._step_at(params, cache, (text,) + tuple(context[1:]), p)

  def generate(self, params, prompts, num, sampling, seeds, stop_ids=()):
    self._check_index()
    return super().generate(params, prompts, num, sampling, seeds, stop_ids)

  def forced_log_probs(self, params, prompts, forced):
    self._check_index()
    return super().forced_log_probs(params, prompts, forced)

  def _check_index(self) -> None:
    if self.retriever is None:
      raise errors.ConfigError(
          "generate: MARGE decodes with its run's index "
          "(MargeDecoder.prepare_run)"
      )

  def _prepare(self, prompts: Sequence[np.ndarray], num: int) -> tuple:
    """Every row's first token, the rest of its prompt fed one step at a
    time (``decode_prompts.from_start``)."""
    return decode_prompts.from_start(prompts, num, 1)
