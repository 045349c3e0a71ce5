"""Key/value-cache decoding of a LaMemo LM (a memory of M, segments of T).

LaMemo's memory is not the keys a cache keeps: at each segment's start
every layer refreshes its M memory rows by look-ahead (they attend to the
window that ends at the segment's first token) and interpolates them with
their old vectors, and the segment's tokens read the refreshed rows. After
that first token nothing changes them until the segment ends: the
look-ahead reads no later token (``lamemo.look_ahead_window``). So
``LaMemoDecoder`` decodes a segment as

* its start: the stack runs the M memory rows (the layer-0 inputs of the
  last M tokens) and the segment's first token (or its first tokens, in a
  prefill), [B, M + Q, D], as training runs a segment, and every layer
  keeps the rows' keys, values, attention outputs C and log-normalisers
  (``segment_memory.LaMemoCache``, slots 0 .. M + Q - 1);
* each later token: one cached step at slot M + i, reading the slots
  before it with the relative terms of their slot distances;
* its end: the memory the next segment starts with is the last M rows of
  (C, log-normaliser, valid) of every layer and of the layer-0 inputs,
  exactly the ``fifo_append`` of training's update.

Every row's stream starts at the decoding's first step: the whole
segments of the shortest prompt are prefilled, segment by segment as
training runs them ([B, M + T] rows each), and the rest of every prompt is
fed one step at a time, so the rows of a batch are at the same segment
position at every step: prompts of different lengths share the segment
starts, and a row draws once its prompt is fed.

Every prediction thus reads what recurrent evaluation (segments of T from
the stream's start, the memory carried) gives it. Cost per token: one row
per layer, plus M + 1 rows at each segment's start.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax.methods.recurrent import segment_memory as rmemory
from memjax.models import decode_prompts
from memjax.models import lm_decoding
from memjax.models import stack
from memjax.models import variables as model_vars

Array = jax.Array


def cached_attention(
    layer: Any, x: Array, cache: rmemory.LaMemoCache, pos: Array
) -> tuple[Array, rmemory.LaMemoCache]:
  """A ``LaMemoAttention`` layer over its decoding cache.

  Args:
    layer: the bound ``LaMemoAttention``.
    x: [B, M + Q, D] normed rows at a segment's start (the memory rows,
      then its first Q tokens), else [B, 1, D] the token at slot ``pos``.
    cache: the layer's ``LaMemoCache`` (M + T slots).
    pos: scalar int32, the token's slot M + i (ignored at a start).

  Returns:
    ([B, M + Q or 1, D] after the output projection, the cache with the
    rows written).
  """
  x = x.astype(layer.dtype)
  mem_len, total = cache.old.c.shape[1], cache.k.shape[1]
  if x.shape[1] > 1:  # A segment's start, as training runs it.
    q, k, v, c_seg, lse_seg, _ = layer.segment_attention(x, cache.old, True)
    c_mem, lse_mem = layer.refreshed_memory(
        q, k, v, cache.old, total - mem_len, True
    )
    c = jnp.concatenate([c_mem, c_seg], axis=1)
    rows = {
        "k": k,
        "v": v,
        "c": c,
        "lse": jnp.concatenate([lse_mem, lse_seg], axis=1),
        "valid": jnp.concatenate(
            [
                cache.old.valid,
                jnp.ones((x.shape[0], x.shape[1] - mem_len), bool),
            ],
            axis=1,
        ),
    }
    fresh = {n: jnp.zeros_like(getattr(cache, n)) for n in rows}
    at = jnp.int32(0)
  else:  # One token at slot pos.
    k = jax.lax.dynamic_update_slice_in_dim(
        cache.k, layer.core.project(x, "key").astype(cache.k.dtype), pos, 1
    )
    v = jax.lax.dynamic_update_slice_in_dim(
        cache.v, layer.core.project(x, "value").astype(cache.v.dtype), pos, 1
    )
    valid = jax.lax.dynamic_update_slice_in_dim(
        cache.valid, jnp.ones((x.shape[0], 1), bool), pos, 1
    )
    keep = valid & (jnp.arange(total)[None, :] <= pos)
    scores = layer.core.scores(
        layer.core.project(x, "query"), k, delta_top=pos, past_only=True
    )
    c, lse, _ = layer.core.attend(scores, keep[:, None, None, :], v, True)
    rows = {"c": c, "lse": lse}
    fresh = {"k": k, "v": v, "valid": valid, "c": cache.c, "lse": cache.lse}
    at = pos
  put = lambda n: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
      fresh[n], rows[n].astype(fresh[n].dtype), at, 1
  )
  new = cache.replace(**{n: put(n) if n in rows else fresh[n] for n in fresh})
  return layer._project(c), new  # pylint: disable=protected-access


class LaMemoDecoder(lm_decoding.CachedDecoder):
  """Cached decoding of a LaMemo LM (see the module doc); the state's
  context is the layer-0 inputs of the memory rows and the segment
  (``XLMemory`` [B, M + T, D])."""

  def __init__(self, model, reader=None, segment_len=0, windows=None):
    super().__init__(model, reader, segment_len, windows)
    if self.segment_len < 1:
      raise errors.ConfigError(
          "generate: LaMemo decodes by segments; give eval.segment_len or "
          "data.seq_len >= 1"
      )

  def init_cache(self, batch: int, length: int) -> tuple:
    """Per layer, an empty ``LaMemoCache`` of M + T slots (``length``
    is not read)."""
    del length
    cfg = self.model.cfg
    m, t = cfg.mem_len, self.segment_len
    kv = jnp.zeros(
        (batch, m + t, cfg.num_heads, cfg.head_dim), cfg.compute_dtype
    )
    c = jnp.zeros(kv.shape, jnp.float32)
    old = rmemory.init_lamemo_memory(batch, m, cfg.num_heads, cfg.head_dim)
    one = rmemory.LaMemoCache(
        k=kv,
        v=kv,
        c=c,
        lse=c[..., 0],
        valid=jnp.zeros((batch, m + t), bool),
        old=old,
    )
    return decode_prompts.constrain_cache(
        tuple(one for _ in range(cfg.num_layers))
    )

  def _run(self, params, cache, inputs, tokens, slot, start):
    """Tokens [B, Q] from ``slot`` on (a start: the memory rows and a
    segment's first Q tokens) -> ([B, V] log-probabilities after the last,
    cache, inputs)."""
    m = self.model.cfg.mem_len

    def fn(mdl):
      x = mdl.embedder.embed(tokens)
      rows = (
          jnp.concatenate([inputs.x[:, :m].astype(x.dtype), x], 1)
          if start
          else x
      )
      shared = (
          {} if mdl.ffn_shared is None else {"ffn_shared": mdl.ffn_shared()}
      )
      h, _, new = stack.apply(
          mdl.blocks, rows, cache, True, attend_inputs={"pos": slot}, **shared
      )
      h = h[:, -1]
      h = mdl.final_norm(h) if mdl.final_norm else h
      return mdl.log_probs(h), x, decode_prompts.constrain_cache(tuple(new))

    logp, x, cache = self.model.apply(
        model_vars.as_variables(params), method=fn
    )
    put = lambda a, r: jax.lax.dynamic_update_slice_in_dim(a, r, slot, 1)  # noqa: E731
    inputs = rmemory.XLMemory(
        x=put(inputs.x, x.astype(inputs.x.dtype)),
        valid=put(inputs.valid, jnp.ones(x.shape[:2], bool)),
    )
    return logp, cache, inputs

  def _start(self, params, cache, inputs, tokens):
    """A segment's start, its first tokens [B, Q]: the last segment's rows
    become the memory."""
    m = self.model.cfg.mem_len
    tail = lambda a: jnp.zeros_like(a).at[:, :m].set(a[:, -m:])  # noqa: E731
    cache = tuple(
        c.replace(
            old=rmemory.LaMemoMemory(
                c=c.c[:, -m:], lse=c.lse[:, -m:], valid=c.valid[:, -m:]
            )
        )
        for c in cache
    )
    inputs = rmemory.XLMemory(x=tail(inputs.x), valid=tail(inputs.valid))
    return self._run(params, cache, inputs, tokens, jnp.int32(m), True)

  @functools.partial(jax.jit, static_argnums=(0, 5))
  def prefill(self, params, tokens, positions, key_valid, length):
    """The rows' first P tokens [B, P] (the same number for every row),
    segment by segment as training runs them -> ([B, V] log-probabilities
    after the last, cache, layer-0 inputs)."""
    del positions, key_valid
    cfg, batch = self.model.cfg, tokens.shape[0]
    cache = self.init_cache(batch, length)
    inputs = rmemory.init_xl_memory(
        batch, cfg.mem_len + self.segment_len, cfg.d_model, cfg.compute_dtype
    )
    for a in range(0, tokens.shape[1], self.segment_len):
      chunk = tokens[:, a : a + self.segment_len]
      logp, cache, inputs = self._start(params, cache, inputs, chunk)
    return logp, cache, inputs

  def step(self, params, cache, context, token, position, key_valid, slot):
    """[B] tokens at stream ``position`` (the same for every row) ->
    ([B, V] log-probs, cache, layer-0 inputs)."""
    del key_valid, slot
    i = position[0] % self.segment_len
    m = self.model.cfg.mem_len
    return jax.lax.cond(
        i == 0,
        lambda: self._start(params, cache, context, token[:, None]),
        lambda: self._run(params, cache, context, token[:, None], m + i, False),
    )

  def _prepare(self, prompts: Sequence[np.ndarray], num: int) -> tuple:
    """The prefill: every row's first P tokens, P the whole segments of
    the shortest prompt (one compilation per number of segments; its
    first token when that is shorter than a segment); the rest of each
    prompt is fed one step at a time (``decode_prompts.from_start``)."""
    shortest = min(len(np.reshape(p, -1)) for p in prompts)
    width = max(shortest // self.segment_len * self.segment_len, 1)
    return decode_prompts.from_start(prompts, num, width)
