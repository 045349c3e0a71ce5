"""Greedy and beam search for the encoder-decoder, jitted and batched.

Both run a ``jax.lax.while_loop`` over target positions with the decoder's
self-attention keys and values cached (``EncoderDecoder.init_cache`` /
``decode_step``): one step costs one token per row, so a sentence of T tokens
costs O(T) decoder positions, where recomputing the prefix would cost
O(T^2) (on the CPU demo that is the difference between seconds and minutes
per split). The loop stops when every sentence is finished or at
``max_len = max_len_a * S + max_len_b`` target tokens (fairseq's
``--max-len-a/-b``), where EOS is forced.

Beam search follows fairseq's ``SequenceGenerator``: each step takes the 2K
best (beam, token) continuations; an EOS among the first K is finished with
the score sum(log p) / length**lenpen (length counts the EOS); the K best
others stay alive; a sentence is done once it has K finished hypotheses,
and the best finished one is returned. With K = 1 this is greedy search.
Neither ever picks the padding id 0 (fairseq's ``lprobs[:, pad] = -inf``,
"never select pad"): a pad would end the output early (``strip``).

``hook(log_probs [N, V], g [N, D], step) -> log_probs`` adjusts every
step's log-probabilities before the choice (N = batch x beam rows, g the
last decoder layer's feed-forward input at the step): the place where an
evaluation memory (kNN-MT, TRIME's memory) mixes in its distribution. A
hook with the attribute ``takes_log_z = True`` is called as
``hook(log_probs, g, step, log_z [N])`` with the softmax's log-normaliser
(a joint softmax of memory and vocabulary logits needs the logits' scale).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from memjax.data import token_batching
from memjax.data import vocab
from memjax.models import variables as model_vars

Array = jax.Array
LogProbHook = Callable[[Array, Array, Array], Array]
EOS = vocab.EOS_ID
NEG = -1e9


def max_target_len(src_len: int, max_len_a: float, max_len_b: int) -> int:
  """Target positions decoded for a source of ``src_len`` (>= 1)."""
  return max(1, int(max_len_a * src_len + max_len_b))


def _start(model, params, source, rows_per_sentence, max_len):
  """Encodes and builds the cache for ``rows_per_sentence`` rows each."""
  enc, mask = model.apply(
      model_vars.as_variables(params), source, method=model.encode
  )
  if rows_per_sentence > 1:
    rep = lambda x: jnp.repeat(x, rows_per_sentence, axis=0)
    enc, mask = rep(enc), rep(mask)
  cache = model.apply(
      model_vars.as_variables(params), enc, max_len, method=model.init_cache
  )
  return cache, mask


def _step(model, params, hook, token, t, cache, mask):
  if getattr(hook, "takes_log_z", False):
    logp, g, cache, log_z = model.apply(
        model_vars.as_variables(params),
        token,
        t,
        cache,
        mask,
        True,
        method=model.decode_step,
    )
    return _never_pad(hook(logp, g, t, log_z)), cache
  logp, g, cache = model.apply(
      model_vars.as_variables(params),
      token,
      t,
      cache,
      mask,
      method=model.decode_step,
  )
  if hook is not None:
    logp = hook(logp, g, t)
  return _never_pad(logp), cache


def _never_pad(logp: Array) -> Array:
  """[N, V] log-probabilities with the pad id's set to NEG."""
  return logp.at[:, vocab.PAD_ID].set(NEG)


def greedy_search(
    model,
    params: Any,
    source: Array,
    max_len: int,
    hook: Optional[LogProbHook] = None,
) -> Array:
  """[B, S] source ids -> [B, max_len] target ids (EOS, then 0)."""
  b = source.shape[0]
  cache, mask = _start(model, params, source, 1, max_len)

  def cond(state):
    t, _, done, _ = state
    return (t < max_len) & ~jnp.all(done)

  def body(state):
    t, tokens, done, cache = state
    prev = jnp.where(
        t == 0, token_batching.DECODER_START, tokens[:, jnp.maximum(t - 1, 0)]
    )
    logp, cache = _step(model, params, hook, prev, t, cache, mask)
    nxt = jnp.argmax(logp, axis=-1).astype(jnp.int32)
    nxt = jnp.where(t == max_len - 1, EOS, nxt)
    nxt = jnp.where(done, 0, nxt)
    tokens = tokens.at[:, t].set(nxt)
    return t + 1, tokens, done | (nxt == EOS), cache

  init = (
      jnp.int32(0),
      jnp.zeros((b, max_len), jnp.int32),
      jnp.zeros((b,), bool),
      cache,
  )
  return jax.lax.while_loop(cond, body, init)[1]


@dataclasses.dataclass
class BeamResult:
  """Beam search output.

  Attributes:
    tokens: [B, T] the best hypothesis (EOS, then 0s).
    hypotheses: [B, K, T] the finished hypotheses, best first.
    scores: [B, K] their length-normalised scores (NEG for empty slots).
  """

  tokens: Array
  hypotheses: Array
  scores: Array


jax.tree_util.register_dataclass(
    BeamResult, data_fields=["tokens", "hypotheses", "scores"], meta_fields=[]
)


def beam_search(
    model,
    params: Any,
    source: Array,
    max_len: int,
    beam_size: int,
    length_penalty: float = 1.0,
    hook: Optional[LogProbHook] = None,
) -> BeamResult:
  """Beam search (module docstring) over [B, S] source ids."""
  b, k = source.shape[0], beam_size
  cache, mask = _start(model, params, source, k, max_len)
  pos = jnp.arange(2 * k)

  def cond(state):
    return (state["t"] < max_len) & ~jnp.all(state["done"])

  def body(s):
    t = s["t"]
    prev = jnp.where(
        t == 0,
        token_batching.DECODER_START,
        s["alive"][:, :, jnp.maximum(t - 1, 0)],
    ).reshape(-1)
    logp, cache = _step(model, params, hook, prev, t, s["cache"], mask)
    v = logp.shape[-1]
    is_eos_col = jnp.arange(v) == EOS
    logp = jnp.where((t == max_len - 1) & ~is_eos_col, NEG, logp)
    cand = (s["alive_logp"][:, :, None] + logp.reshape(b, k, v)).reshape(b, -1)
    top, idx = jax.lax.top_k(cand, 2 * k)  # [B, 2K]
    beam, tok = idx // v, (idx % v).astype(jnp.int32)
    seqs = jnp.take_along_axis(s["alive"], beam[:, :, None], axis=1)
    seqs = seqs.at[:, :, t].set(tok)  # [B, 2K, T]
    eos = (tok == EOS) & (top > NEG / 2)
    # Finished: EOS among the first K candidates of a sentence not yet done.
    new_fin = eos & (pos < k)[None] & ~s["done"][:, None]
    norm = top / jnp.float32(t + 1) ** length_penalty
    fin_scores = jnp.concatenate(
        [s["fin_scores"], jnp.where(new_fin, norm, NEG)], 1
    )
    fin_seqs = jnp.concatenate([s["fin"], seqs], axis=1)
    fin_top, fin_idx = jax.lax.top_k(fin_scores, k)
    fin = jnp.take_along_axis(fin_seqs, fin_idx[:, :, None], axis=1)
    count = s["count"] + jnp.sum(new_fin, axis=1)
    # Alive: the K best continuations that are not EOS.
    alive_top, alive_idx = jax.lax.top_k(jnp.where(eos, NEG, top), k)
    alive = jnp.take_along_axis(seqs, alive_idx[:, :, None], axis=1)
    rows = (
        jnp.take_along_axis(beam, alive_idx, axis=1)
        + jnp.arange(b)[:, None] * k
    ).reshape(-1)
    cache = {
        "cross": cache["cross"],
        "self": jax.tree.map(lambda x: x[rows], cache["self"]),
    }
    return {
        "t": t + 1,
        "alive": alive,
        "alive_logp": alive_top,
        "fin": fin,
        "fin_scores": fin_top,
        "count": count,
        "done": s["done"] | (count >= k) | (t == max_len - 1),
        "cache": cache,
    }

  first = jnp.where(jnp.arange(k) == 0, 0.0, NEG)
  init = {
      "t": jnp.int32(0),
      "alive": jnp.zeros((b, k, max_len), jnp.int32),
      "alive_logp": jnp.broadcast_to(first, (b, k)).astype(jnp.float32),
      "fin": jnp.zeros((b, k, max_len), jnp.int32),
      "fin_scores": jnp.full((b, k), NEG, jnp.float32),
      "count": jnp.zeros((b,), jnp.int32),
      "done": jnp.zeros((b,), bool),
      "cache": cache,
  }
  out = jax.lax.while_loop(cond, body, init)
  return BeamResult(out["fin"][:, 0], out["fin"], out["fin_scores"])


def strip(ids: np.ndarray) -> list[int]:
  """The ids before the first EOS (or pad)."""
  out = []
  for i in np.asarray(ids).tolist():
    if i in (EOS, vocab.PAD_ID):
      break
    out.append(int(i))
  return out


@functools.lru_cache(maxsize=None)
def _jitted(model, kind: str, max_len: int, beam: int, lenpen: float, hook):
  if kind == "greedy":
    return jax.jit(lambda p, s: greedy_search(model, p, s, max_len, hook))
  return jax.jit(
      lambda p, s: beam_search(model, p, s, max_len, beam, lenpen, hook)
  )


def source_bucket(length: int) -> int:
  """Padded source length: the next power of two >= 8 (few compilations)."""
  return max(8, 1 << (max(1, length) - 1).bit_length())
