"""How a batch of prompts sits in a decoder's key/value cache, and the
cache on the run's mesh.

The prompts are left-padded to a common length P (a multiple of
``BUCKET``) and the cache has L slots (P, the rest of prompts longer than
a window, and the new tokens, rounded up to ``BUCKET``), so a model
compiles once per (batch size, P, L). Row b's real tokens sit at slots
P - n_b .. P - 1 and its positions start at 0 at its first real token
(``left_align`` derives them from any padding mask).

On a run's mesh (``on_mesh``) a batch is padded to a multiple of the
mesh's data axes and the cache's arrays carry ``CACHE_AXES`` (``constrain_cache``): its rows
split over the data axes, its heads over 'tensor'.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import contextlib

import flax.linen as nn
import jax
import numpy as np

from memjax import errors
from memjax import sharding as sharding_lib
from memjax.io import console
from memjax.models import decode_windows

# Prompt and cache lengths are rounded up to a multiple of this.
BUCKET = 64

# The logical axes of a cache's arrays by rank (their first axis is the
# batch's rows, their second the slots): keys and values [B, L, H, d_h],
# log-normalisers [B, L, H], masks [B, L].
CACHE_AXES = {
    4: ("batch", "length", "heads", "kv"),
    3: ("batch", "length", "heads"),
    2: ("batch", "length"),
}


def constrain_cache(cache: Any) -> Any:
  """``cache`` with its arrays constrained to ``CACHE_AXES`` (the run's
  mesh under ``sharding.mesh_rules``; no-ops otherwise)."""
  return jax.tree.map(
      lambda x: nn.with_logical_constraint(x, CACHE_AXES[x.ndim]), cache
  )


def on_mesh(mesh: Any, rows: int) -> tuple[Any, int]:
  """(the context that lays the decoder's arrays out on ``mesh``, or a
  null context for None; the rows a batch of ``rows`` is padded to: a
  multiple of the mesh's data axes)."""
  if mesh is None:
    return contextlib.nullcontext(), rows
  dp = sharding_lib.data_parallel(mesh)
  return sharding_lib.mesh_rules(mesh), -(-rows // dp) * dp


def bucket(n: int) -> int:
  """n rounded up to a multiple of ``BUCKET``."""
  return -(-int(n) // BUCKET) * BUCKET


def left_align(tokens: np.ndarray, mask: np.ndarray, width: int) -> tuple:
  """Each row's real tokens (``mask``, left- or right-padded) moved to the
  right end of ``width`` slots.

  Args:
    tokens: [B, S] int ids.
    mask: [B, S] bool, True = a real token (contiguous in each row).
    width: the padded length P >= every row's count.

  Returns:
    (tokens [B, P] int32 (0 at padding), positions [B, P] int32 (0 at a
     row's first real token, 0 at padding), lengths [B] int32).
  """
  tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
  b = tokens.shape[0]
  out = np.zeros((b, width), np.int32)
  lengths = mask.sum(axis=1).astype(np.int32)
  for i in range(b):
    out[i, width - lengths[i] :] = tokens[i][mask[i]]
  slots = np.arange(width)[None, :]
  positions = np.maximum(slots - (width - lengths[:, None]), 0)
  return out, positions.astype(np.int32), lengths


def lay_out(
    prompts: Sequence[np.ndarray],
    num: int,
    model: Any,
    windows: Optional[decode_windows.Windows],
) -> tuple:
  """The prompts laid out for a prefill and ``num`` new tokens.

  Args:
    prompts: [n_b >= 1] int token ids per row.
    num: new tokens at most.
    model: the decoder LM (its positions).
    windows: evaluation's windows the decoder keeps, or None.

  Returns:
    (tokens [B, P] left-padded, positions [B, P], lengths [B], key_valid
    [B, L] bool, (rest [B, R], rest lengths [B])). In windows the prefill
    takes a prompt's first window (``window_len`` tokens) and ``rest``
    holds the remainder, fed one step at a time (the windows slide over
    it); else R = 0, and with absolute positions a prompt keeps the last
    tokens the model's positions leave room for, with a notice.

  Raises:
    errors.ConfigError: an empty prompt, or more new tokens than absolute
      positions allow.
  """
  prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
  if any(not len(p) for p in prompts):
    raise errors.ConfigError("generate: every prompt needs >= 1 token")
  rest_len = np.zeros((len(prompts),), np.int32)
  rest = np.zeros((len(prompts), 0), np.int32)
  if windows is not None:  # Windows keep positions below T.
    t = windows.window_len
    rest_len = np.asarray([max(len(p) - t, 0) for p in prompts], np.int32)
    rest = np.zeros((len(prompts), int(rest_len.max())), np.int32)
    for b, p in enumerate(prompts):
      rest[b, : rest_len[b]] = p[t:]
    prompts = [p[:t] for p in prompts]
  elif model.attention_kind().ABSOLUTE_POSITIONS and model.positions != "none":
    prompts = _fit_positions(prompts, num, model.cfg.max_len)
  width = bucket(max(len(p) for p in prompts))
  length = bucket(width + rest.shape[1] + num)
  mask = np.zeros((len(prompts), width), bool)
  padded = np.zeros((len(prompts), width), np.int32)
  for i, p in enumerate(prompts):
    padded[i, : len(p)], mask[i, : len(p)] = p, True
  tokens, positions, lengths = left_align(padded, mask, width)
  key_valid = np.arange(length)[None, :] >= (width - lengths)[:, None]
  return tokens, positions, lengths, key_valid, (rest, rest_len)


def _fit_positions(
    prompts: list[np.ndarray], num: int, max_len: int
) -> list[np.ndarray]:
  """Each prompt's last tokens that leave room for ``num`` new ones in
  ``max_len`` absolute positions (a notice when one is cut)."""
  room = max_len - num + 1
  if room < 1:
    raise errors.ConfigError(
        f"generate: {num} new tokens do not fit model.max_len {max_len}"
    )
  if any(len(p) > room for p in prompts):
    console.info(
        "generate: prompts longer than %d tokens keep their last %d "
        "(model.max_len %d)",
        room,
        room,
        max_len,
    )
  return [p[-room:] for p in prompts]


def from_start(prompts: Sequence[np.ndarray], num: int, width: int) -> tuple:
  """The layout of a decoder whose rows all start their stream at the
  first step (LaMemo's segments, MARGE's windows): every row's first
  ``width`` tokens (at most the shortest prompt's length) for the
  prefill, and the rest of each prompt fed one step at a time.

  Returns:
    ``lay_out``'s tuple: tokens [B, width], positions (zeros: unused),
    lengths [B] (all ``width``), key_valid [B, L] (all True: the slots
    of the stream, L = width + R + num rounded up to ``BUCKET`` as
    ``lay_out`` rounds it, one compilation per bucket; its shape alone
    is read), (rest [B, R], rest lengths [B]).

  Raises:
    errors.ConfigError: an empty prompt.
  """
  prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
  if any(not len(p) for p in prompts):
    raise errors.ConfigError("generate: every prompt needs >= 1 token")
  b = len(prompts)
  rest_len = np.asarray([len(p) - width for p in prompts], np.int32)
  rest = np.zeros((b, int(rest_len.max())), np.int32)
  for i, p in enumerate(prompts):
    rest[i, : rest_len[i]] = p[width:]
  tokens = np.asarray([p[:width] for p in prompts], np.int32)
  lengths = np.full((b,), width, np.int32)
  key_valid = np.ones((b, bucket(width + rest.shape[1] + num)), bool)
  return tokens, 0 * tokens, lengths, key_valid, (rest, rest_len)
