"""Evaluation's sliding windows, kept by a decoder that grows a text.

``--mode=eval`` and ``--mode=memeval`` score a model without recurrent
memory in sliding windows of ``eval.window_len`` T predictions that score
their last ``eval.score_len`` S (``data.windows.eval_windows``): prediction
p (the query at stream token x_p, predicting x_{p+1}) is in the window
[0, p] while p < T, else in the window that starts at
s = p - (p - T) % S - (T - S). A decoder that keeps to the same windows
gives every prefix the distribution evaluation gives it: when a row's
prediction reaches T + kS the window slides, and the decoder
(``lm_decoding.CachedDecoder``) runs that row's T - S context tokens and x_p
again as a window of their own (positions from 0; BOS first where
evaluation puts one, ``data.windows.begin_with_bos``).

Slots: row b's stream token i sits at the decoder's cache slot
``offset[b] + i`` for the whole decoding (the slots only grow), so a slide
rewrites the row's slots in place and masks the ones before its window;
the rows of a batch slide on their own steps.

An evaluation memory read while generating (``memjax.memory.generation``)
also keeps each slot's memory features in the ``Context``; without one
they have width 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp

from memjax import errors

Array = jax.Array


@flax.struct.dataclass
class Context:
  """The decoded context of a batch of rows in their windows.

  Attributes:
    features: [B, L, D] float32 the memory feature g of each slot, computed
      in the row's current window (an evaluation memory's M_local keys; D =
      0 without a memory).
    scored: [B, L, D] float32 g of each slot, as the window that scored it
      computed it (M_long's keys).
    next_tokens: [B, L] int32 the token that followed each slot (0 until
      known): slot j + 1's token, so also the stream the windows re-run.
    offset: [B] int32 the slot of each row's stream token 0.
    start: [B] int32 the stream index each row's window starts at.
  """

  features: Array
  scored: Array
  next_tokens: Array
  offset: Array
  start: Array


@dataclasses.dataclass(frozen=True)
class Windows:
  """Evaluation's windows (see the module doc).

  Attributes:
    window_len: T, the predictions of a window (``eval.window_len``).
    score_len: S, the predictions a window after the first scores
      (``eval.score_len``).
    bos: the BOS id evaluation's windows after the first begin with
      (``data.windows.begin_with_bos``), or None.
  """

  window_len: int
  score_len: int
  bos: Optional[int] = None

  def __post_init__(self) -> None:
    if not 1 <= self.score_len <= self.window_len:
      raise errors.ConfigError(
          f"generate needs 1 <= eval.score_len ({self.score_len}) <= "
          f"eval.window_len ({self.window_len})"
      )

  @classmethod
  def of(cls, scoring: Any) -> "Windows":
    """The windows a restored run's ``scoring`` (``eval.rows.Scoring``)
    evaluates in."""
    return cls(
        int(scoring.eval.window_len),
        int(scoring.eval.score_len),
        scoring.window_bos,
    )

  @staticmethod
  def init_context(
      g: Array, tokens: Array, lengths: Array, length: int
  ) -> Context:
    """The context after a prefill of the first window.

    Args:
      g: [B, P, D] float32 features of the prefilled slots (D may be 0).
      tokens: [B, P] int32 left-padded prompts (row b's at P - n_b ..).
      lengths: [B] int32 prompt lengths n_b.
      length: L, the cache's slots.
    """
    b, p, d = g.shape
    feats = jnp.zeros((b, length, d), jnp.float32).at[:, :p].set(g)
    nxt = jnp.zeros((b, length), jnp.int32).at[:, : p - 1].set(tokens[:, 1:])
    return Context(
        features=feats,
        scored=feats,
        next_tokens=nxt,
        offset=(p - lengths).astype(jnp.int32),
        start=jnp.zeros((b,), jnp.int32),
    )

  @staticmethod
  def window_valid(context: Context, key_valid: Array) -> Array:
    """[B, L] bool: the row's slots from its window's start on."""
    slots = jnp.arange(key_valid.shape[1])[None, :]
    return key_valid & (slots >= (context.offset + context.start)[:, None])

  @staticmethod
  def positions(context: Context, slot: Array) -> Array:
    """[B] int32: the position of the query at ``slot`` in its row's
    window."""
    return slot - context.offset - context.start

  @staticmethod
  def record(context: Context, g: Array, token: Array, slot: Array) -> Context:
    """The context after a step that ran ``token`` [B] at ``slot``, its
    feature ``g`` [B, 1, D] (scored there: the step's query)."""
    g = g.astype(jnp.float32)
    put = lambda x, v, at: jax.lax.dynamic_update_slice_in_dim(x, v, at, axis=1)  # noqa: E731
    return context.replace(
        features=put(context.features, g, slot),
        scored=put(context.scored, g, slot),
        next_tokens=put(context.next_tokens, token[:, None], slot - 1),
    )

  def slides(self, context: Context, slot: Array) -> Array:
    """[B] bool: the rows whose query at ``slot`` starts a new window."""
    t, s = self.window_len, self.score_len
    p = slot - context.offset
    return (p >= t) & ((p - t) % s == 0)

  def window_tokens(self, context: Context, row: Array, slot: Array):
    """Row ``row``'s new window at a slide, its query at ``slot``: (tokens
    [C] int32, the stream index it starts at), C = T - S + 1."""
    c = self.window_len - self.score_len + 1
    start = slot - context.offset[row] - (c - 1)
    # The tokens at slots slot - c + 1 .. slot: each the one after the
    # slot before (start >= S >= 1, so that slot is the row's).
    tokens = jax.lax.dynamic_slice_in_dim(context.next_tokens[row], slot - c, c)
    if self.bos is not None:  # As evaluation's windows after the first.
      tokens = tokens.at[0].set(self.bos)
    return tokens, start

  @staticmethod
  def moved(context: Context, row: Array, first: Array, g: Array, start):
    """The context after row ``row``'s window, starting at stream index
    ``start`` (slot ``first``), ran again with features ``g`` [C, D]: the
    last of them is the query's, scored there."""
    g = g.astype(jnp.float32)
    feats = jax.lax.dynamic_update_slice_in_dim(
        context.features[row], g, first, axis=0
    )
    slot = first + g.shape[0] - 1
    return context.replace(
        features=context.features.at[row].set(feats),
        scored=context.scored.at[row, slot].set(g[-1]),
        start=context.start.at[row].set(start),
    )
