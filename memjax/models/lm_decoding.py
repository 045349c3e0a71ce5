"""Key/value-cache decoding of a decoder LM (model.family 'decoder_lm').

``CachedDecoder`` continues a batch of prompts: the prompts are
left-padded to a common length P (``decode_prompts``: one compilation per
batch size, P and the cache's L slots), one call (prefill) runs them and
writes every layer's keys and values into the cache, then one cached
step per new token runs the last token alone, all steps in one compiled
loop. Row b's real tokens sit at slots P - n_b .. P - 1 and its
positions start at 0 at its first real token; a row reads
only its own slots (``key_valid``), causally, and a sliding-window layer
only its last ``sliding_window`` W positions, from a rolling cache of W
slots (``rolling_cache``).

What a query reads (``decoder`` picks the decoder):

* A model without recurrent memory, given ``windows``
  (``decode_windows.Windows``, as the front doors give it): evaluation's
  sliding windows, so each prefix gets evaluation's distribution; a
  prompt's first window is prefilled and its rest fed one step at a time,
  and a row whose query starts a window runs it again (``_slide``).
  Without ``windows``: every earlier position of its row (a prompt longer
  than absolute positions allow keeps its last tokens, with a notice).
* Transformer-XL with its memory of M: the positions from M before its
  segment of T (``segment_len``) on (``AttentionKind.cached_context``):
  the memory's keys and values are those the cache keeps of them.
* A kind whose memory is not the keys a cache keeps has a decoder of its
  own (``AttentionKind.cached_decoder``: LaMemo's).

Covered: 'vanilla' with rotary positions (every scaling of ``rotary``),
learned or sinusoid absolute positions, grouped-query heads (the cache
holds H_kv heads), sliding windows and Gemma 3's local/global layers; the
relative kinds ('rpe', 'xl', 'lamemo'); any position-wise feed-forward
(FFN, GLU, product-key memory); scanned layers (decoded unrolled,
``_layers``). Other families (MARGE, the encoders) are ``unsupported``.

Sampling (``memjax.models.sampling``): greedy, or temperature, top-k and
top-p filtering; row b draws token t with ``fold_in(PRNGKey(seeds[b]),
t)``. A row stops after drawing one of ``stop_ids`` (the id included) and
emits nothing more.

With an evaluation memory (``reader``, a
``memjax.memory.generation.MemoryReader``), every step's distribution is
the memory's, in the reader's windows (evaluation's), the memory features
of each slot kept beside the cache (``decode_windows.Context``).
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax.models import block_stack
from memjax.models import decode_prompts
from memjax.models import decode_windows
from memjax.models import layer_layout
from memjax.models import rolling_cache
from memjax.models import sampling as sampling_lib
from memjax.models import stack
from memjax.models import variables as model_vars
from memjax.models import transformer

Array = jax.Array


def unsupported(model: Any) -> Optional[str]:
  """Why ``model`` cannot decode with a cache, or None when it can."""
  if not isinstance(model, transformer.TransformerLM):
    return f"family {type(model).__name__} is not a decoder LM"
  if not model.attention_kind().decodes_cached(model.cfg.mem_len):
    return (
        f"attention kind {model.cfg.attention!r} (memory {model.cfg.mem_len})"
        " has no cached decoding"
    )
  return None


def decoder(
    model: transformer.TransformerLM,
    reader: Any = None,
    segment_len: int = 0,
    windows: Optional[decode_windows.Windows] = None,
) -> "CachedDecoder":
  """The cached decoder of ``model``: its own
  (``TransformerLM.cached_decoder``: its family's or its attention
  kind's), else ``CachedDecoder``."""
  own = model.cached_decoder()
  return (own or CachedDecoder)(model, reader, segment_len, windows)


def _forward(
    mdl: transformer.TransformerLM,
    tokens: Array,
    positions: Array,
    mask: Array,
    slot: Array,
    cache: Any,
    cross: Optional[dict[str, Array]] = None,
) -> tuple[Array, Array, Any]:
  """Runs [B, T] tokens at slots slot..slot+T-1 over the cache.

  Args:
    mdl: the bound model.
    tokens: [B, T] int32.
    positions: [B, T] int32 their positions (absolute and rotary kinds).
    mask: [B, 1, T or 1, L] bool, the slots each query may read (besides
      the causal rule).
    slot: scalar int32, the first slot.
    cache: per layer (keys, values) [B, L, H_kv, d_h].
    cross: the cross-attention's inputs of a family that has one (MARGE's
      retrieved sources), or None.

  Returns:
    ([B, T, D] final hidden states, [B, T, D] their memory features g,
     the updated cache).
  """
  x = mdl.embedder.embed(tokens)
  length = mask.shape[-1]  # The text's slots (a layer's cache may roll).
  if mdl.attention_kind().ABSOLUTE_POSITIONS and mdl.positions != "none":
    if mdl.pos_embed is not None:
      table = mdl.pos_embed
    else:
      table = block_stack.sinusoid_table(length, mdl.cfg.d_model)
    x = x + jnp.asarray(table, mdl.cfg.compute_dtype)[positions]
  shared = {} if mdl.ffn_shared is None else {"ffn_shared": mdl.ffn_shared()}
  inputs = {"mask": mask, "pos": slot}
  inputs["positions"] = positions
  if cross is not None:
    shared["cross_inputs"] = cross
  h, g, new = stack.apply(
      mdl.blocks, x, cache, True, attend_inputs=inputs, **shared
  )
  h = mdl.final_norm(h) if mdl.final_norm else h
  return h, g, decode_prompts.constrain_cache(tuple(new))


class CachedDecoder:
  """Prefill and cached steps of a decoder LM (see the module doc).

  Attributes:
    model: the decoder LM.
    reader: an evaluation memory read at every step
      (``memjax.memory.generation.MemoryReader``: M_local and M_long in
      evaluation's windows, as ``--mode=memeval`` reads them), or None for
      the plain model.
    segment_len: T, the segments of a recurrent kind
      (``AttentionKind.cached_context``).
  """

  def __init__(
      self,
      model: transformer.TransformerLM,
      reader: Any = None,
      segment_len: int = 0,
      windows: Optional[decode_windows.Windows] = None,
  ):
    why = unsupported(model)
    if why:
      raise ValueError(f"no cached decoding: {why}")
    if (reader or windows) and model.carries_memory():
      raise ValueError("a model with recurrent memory decodes by segments")
    self.scanned = bool(model.cfg.scan_layers)
    if self.scanned:  # See ``_layers``.
      model = model.with_settings(scan_layers=False)
    self.model = model
    self.reader = reader
    self.segment_len = int(segment_len)
    self.windows = reader.windows if reader is not None else windows
    self.mesh = None  # The run's (``prepare_run``), or None.

  def prepare_run(self, restored: Any, variables: Any) -> None:
    """Reads what the decoder needs of its run besides the parameters:
    here its mesh, which the cache is laid out on (``decode_prompts.CACHE_AXES``:
    the rows over the data axes, the heads over 'tensor'); a family's decoder
    may read more (MARGE: its index)."""
    del variables
    self.mesh = restored.mesh

  def describe(self) -> str:
    """What a token reads, in words (after "decoding with a key/value
    cache")."""
    if self.reader is not None:
      values = ", ".join(f"{k} {v[0]:g}" for k, v in self.reader.settings)
      return f" and the {self.reader.kind} memory ({values})"
    if self.model.carries_memory():
      return (
          f", segments of {self.segment_len}, memory {self.model.cfg.mem_len}"
      )
    if self.windows is not None:
      w = self.windows
      return f" in evaluation's windows of {w.window_len} scoring {w.score_len}"
    return ", every earlier position"

  def _layers(self, params: Any) -> Any:
    """``params`` with one entry per layer. The decoder runs the layers of
    a ``scan_layers`` model one by one: scanned, the layers' caches are
    the scan's stacked outputs, written anew at every step, where unrolled
    layers update their caches in place (trime_150m at batch 8, 768 + 32
    tokens: 140 ms a step scanned, 47 ms unrolled)."""
    return layer_layout.unstack_layers(params) if self.scanned else params

  def _context_mask(self, key_valid, slot, queries, stream):
    """[B, 1, Q, L] bool: the slots each of the Q queries at slots
    ``slot`` .. reads besides the causal rule: its row's real slots from
    the first stream position its attention kind reads
    (``AttentionKind.cached_context``) on.

    Args:
      key_valid: [B, L] bool, the rows' real slots.
      slot: scalar int32, the first query's slot.
      queries: Q.
      stream: [B] int32, the first query's stream position.
    """
    kind, cfg = self.model.attention_kind(), self.model.cfg
    offset = slot - stream  # [B] the slot of stream position 0
    query = stream[:, None] + jnp.arange(queries)[None, :]  # [B, Q]
    first = kind.cached_context(query, self.segment_len, cfg.mem_len)
    slots = jnp.arange(key_valid.shape[1])[None, None, :]
    keep = slots >= (offset[:, None] + first)[:, :, None]  # [B, Q, L]
    return (key_valid[:, None, :] & keep)[:, None]

  def init_cache(self, batch: int, length: int) -> tuple:
    """Zero keys and values [B, L, H_kv, d_h] per layer; a layer whose
    sliding window W is shorter than L keeps W rolling slots
    (``rolling_cache``)."""
    cfg, out = self.model.cfg, []
    for i in range(cfg.num_layers):
      opts = self.model.attention_options_at(i)
      heads = opts.get("num_kv_heads") or cfg.num_heads
      window = int(opts.get("sliding_window") or 0)
      if 0 < window < length:
        out.append(
            rolling_cache.init(
                batch, window, heads, cfg.head_dim, cfg.compute_dtype
            )
        )
        continue
      zeros = jnp.zeros((batch, length, heads, cfg.head_dim), cfg.compute_dtype)
      out.append((zeros, zeros))
    return decode_prompts.constrain_cache(tuple(out))

  @functools.partial(jax.jit, static_argnums=(0, 5))
  def prefill(self, params, tokens, positions, key_valid, length):
    """[B, P] left-padded tokens into a fresh cache of ``length`` slots
    -> ([B, V] float32 log-probabilities after the last, cache, the
    windows' ``Context``, None without windows)."""
    p = tokens.shape[1]
    lengths = jnp.sum(key_valid[:, :p], axis=1).astype(jnp.int32)
    if self.windows is None:
      mask = self._context_mask(key_valid, 0, p, lengths - p)
    else:  # The first window: the whole prompt.
      mask = key_valid[:, None, None, :]

    def fn(mdl):
      cache = self.init_cache(tokens.shape[0], length)
      h, g, cache = _forward(mdl, tokens, positions, mask, 0, cache)
      return mdl.log_probs(h[:, -1], with_log_z=True), g, cache

    scores, g, cache = self.model.apply(
        model_vars.as_variables(params), method=fn
    )
    if self.windows is None:
      return scores[0], cache, None
    context = self.windows.init_context(
        self._features(g), tokens, lengths, length
    )
    return self._read(scores, context, key_valid, p - 1), cache, context

  def _features(self, g: Array) -> Array:
    """[..., D] float32 memory features g, kept for a reader; width 0
    without one."""
    g = g.astype(jnp.float32)
    return g if self.reader is not None else g[..., :0]

  def _read(self, scores, context, key_valid, slot) -> Array:
    """[B, V] the step's log-probabilities: the reader's, else the
    model's."""
    if self.reader is None:
      return scores[0]
    return self.reader.read(scores, context, key_valid, slot)

  def step(self, params, cache, context, token, position, key_valid, slot):
    """[B] tokens at ``slot`` (positions [B]) -> ([B, V] log-probs, cache,
    context). In windows, the positions and the slots read are the rows'
    windows' (``decode_windows``), and a row whose query starts a new
    window runs that window again (``_slide``)."""
    if self.windows is None:
      mask = self._context_mask(key_valid, slot, 1, position)
    else:
      mask = self.windows.window_valid(context, key_valid)[:, None, None, :]
      position = self.windows.positions(context, slot)

    def fn(mdl):
      h, g, new = _forward(
          mdl, token[:, None], position[:, None], mask, slot, cache
      )
      return mdl.log_probs(h[:, 0], with_log_z=True), g, new

    scores, g, cache = self.model.apply(
        model_vars.as_variables(params), method=fn
    )
    if self.windows is None:
      return scores[0], cache, None
    context = self.windows.record(context, self._features(g), token, slot)
    if key_valid.shape[1] > self.windows.window_len:  # Else none slides.
      cache, context, scores = self._slide(
          params, cache, context, scores, key_valid, slot
      )
    return self._read(scores, context, key_valid, slot), cache, context

  def _slide(self, params, cache, context, scores, key_valid, slot):
    """Runs again, as a window of its own, the new window of each row
    whose query at ``slot`` starts one (``Windows.slides``): its keys,
    values and features, and the query's scores. -> (cache, context,
    scores)."""
    moving = self.windows.slides(context, slot)
    length = key_valid.shape[1]
    variables = model_vars.as_variables(params)

    def redo(row, state):
      cache, context, (logp, log_z) = state
      tokens, start = self.windows.window_tokens(context, row, slot)
      first = context.offset[row] + start
      valid = key_valid[row] & (jnp.arange(length) >= first)
      take = lambda x: jax.lax.dynamic_slice_in_dim(x, row, 1)  # noqa: E731

      def fn(mdl):
        h, g, new = _forward(
            mdl,
            tokens[None],
            jnp.arange(tokens.shape[0])[None],
            valid[None, None, None],
            first,
            jax.tree.map(take, cache),
        )
        return mdl.log_probs(h[:, -1], with_log_z=True), g, new

      (lp, lz), g, new = self.model.apply(variables, method=fn)
      put = lambda x, r: jax.lax.dynamic_update_slice_in_dim(x, r, row, 0)  # noqa: E731
      context = self.windows.moved(
          context, row, first, self._features(g[0]), start
      )
      scores = (logp.at[row].set(lp[0]), log_z.at[row].set(lz[0]))
      return jax.tree.map(put, cache, new), context, scores

    def each(row, state):
      return jax.lax.cond(
          moving[row], lambda s: redo(row, s), lambda s: s, state
      )

    return jax.lax.cond(
        jnp.any(moving),
        lambda s: jax.lax.fori_loop(0, moving.shape[0], each, s),
        lambda s: s,
        (cache, context, scores),
    )

  @functools.partial(jax.jit, static_argnums=(0, 1, 2))
  def _loop(
      self,
      sampling,
      width,
      params,
      state,
      lengths,
      key_valid,
      rest,
      seeds,
      stops,
      num,
  ):
    """Draws up to ``num`` tokens per row after a prefill of ``width``
    slots (``state``: its log-probabilities, cache and context) and the
    rest of each row's prompt (``rest``: [B, R] tokens fed first, [B]
    counts) -> [B, L - width] int32 (-1 after a row's stop), all steps in
    one while loop. Row b draws its token g with ``fold_in(key_b, g)``."""
    b, length = key_valid.shape
    keys = jax.vmap(jax.random.PRNGKey)(seeds)
    out = jnp.full((b, length - width), -1, jnp.int32)
    rest, rest_len = rest
    rows = jnp.arange(b)

    def body(carry):
      t, (logp, cache, context), done, out = carry
      g = t - rest_len  # [B] each row's new token, < 0 while fed
      step_keys = jax.vmap(jax.random.fold_in)(keys, jnp.maximum(g, 0))
      token = jnp.where(done, -1, sampling.choose(logp, step_keys))
      fed = rest[:, jnp.minimum(t, rest.shape[1] - 1)] if rest.shape[1] else 0
      at = jnp.maximum(g, 0)
      out = out.at[rows, at].set(jnp.where(g >= 0, token, out[rows, at]))
      token = jnp.where(g < 0, fed, token)
      done = done | ((g >= 0) & (jnp.isin(token, stops) | (g + 1 >= num)))
      state = self.step(
          params,
          cache,
          context,
          jnp.maximum(token, 0),
          lengths + t,
          key_valid,
          width + t,
      )
      return t + 1, state, done, out

    def cond(carry):
      t, _, done, _ = carry
      return (t < jnp.max(rest_len) + num) & ~jnp.all(done)

    init = (jnp.int32(0), state, jnp.zeros((b,), bool), out)
    return jax.lax.while_loop(cond, body, init)[3]

  def forced_log_probs(
      self, params: Any, prompts: Sequence[np.ndarray], forced: np.ndarray
  ) -> np.ndarray:
    """Teacher forcing through the cache: [B, N + 1, V] float32, the
    log-probabilities after each prompt and after each of ``forced``'s
    [B, N] tokens, fed one cached step at a time (after, with a reader,
    the rest of a prompt longer than its first window)."""
    forced = np.asarray(forced, np.int32)
    rows = len(prompts)
    on_mesh, padded = decode_prompts.on_mesh(self.mesh, rows)
    prompts = list(prompts) + [prompts[0]] * (padded - rows)
    forced = np.concatenate([forced, forced[:1].repeat(padded - rows, 0)])
    with on_mesh:
      out = self._forced(self._layers(params), prompts, forced)
    return out[:rows]

  def _forced(self, params, prompts, forced) -> np.ndarray:
    """``forced_log_probs`` of a batch of whole mesh rows."""
    num = forced.shape[1] + 1
    tokens, positions, lengths, key_valid, (rest, rest_len) = self._prepare(
        prompts, num
    )
    logp, cache, context = self.prefill(
        params, tokens, positions, key_valid, key_valid.shape[1]
    )
    step = jax.jit(self.step)
    feed = np.zeros((len(prompts), rest.shape[1] + num), np.int32)
    for b, r in enumerate(rest_len):  # The prompt's rest, then ``forced``.
      feed[b, :r], feed[b, r : r + num - 1] = rest[b, :r], forced[b]
    out, width = [logp], tokens.shape[1]
    for t in range(int(rest_len.max()) + num - 1):
      lp, cache, context = step(
          params,
          cache,
          context,
          jnp.asarray(feed[:, t]),
          jnp.asarray(lengths + t),
          jnp.asarray(key_valid),
          jnp.int32(width + t),
      )
      out.append(lp)
    out = np.asarray(jnp.stack(out, axis=1))
    return np.stack([out[b, r : r + num] for b, r in enumerate(rest_len)])

  def _prepare(self, prompts: Sequence[np.ndarray], num: int) -> tuple:
    """The prompts' layout in the cache (``decode_prompts.lay_out``)."""
    return decode_prompts.lay_out(prompts, num, self.model, self.windows)

  def generate(
      self,
      params: Any,
      prompts: Sequence[np.ndarray],
      num: int,
      sampling: sampling_lib.Sampling,
      seeds: Sequence[int],
      stop_ids: Sequence[int] = (),
  ) -> list[np.ndarray]:
    """Per prompt, up to ``num`` new int32 tokens (to and with the first
    of ``stop_ids``)."""
    sampling.check()
    if num < 1:
      return [np.zeros((0,), np.int32) for _ in prompts]
    rows = len(prompts)
    on_mesh, padded = decode_prompts.on_mesh(self.mesh, rows)
    prompts = list(prompts) + [prompts[0]] * (padded - rows)
    seeds = list(seeds) + [seeds[0]] * (padded - rows)
    params = self._layers(params)
    tokens, positions, lengths, key_valid, rest = self._prepare(prompts, num)
    with on_mesh:
      state = self.prefill(
          params, tokens, positions, key_valid, key_valid.shape[1]
      )
      out = self._loop(
          sampling,
          tokens.shape[1],
          params,
          state,
          jnp.asarray(lengths),
          jnp.asarray(key_valid),
          tuple(jnp.asarray(x) for x in rest),
          jnp.asarray(seeds, jnp.int32),
          jnp.asarray(list(stop_ids) or [-2], jnp.int32),
          jnp.int32(num),
      )
    return [row[row >= 0] for row in np.asarray(out)[:rows]]
