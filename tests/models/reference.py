"""Float64 NumPy references written from the papers' equations.

Everything here loops over (batch, head, query, key) explicitly and uses no
code from memjax.models, so the layers are checked against the equations and
not against themselves.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np


def sinusoid(position: float, dim: int) -> np.ndarray:
  """R_position: [sin(p w_0..w_{dim/2-1}), cos(p w_0..w_{dim/2-1})]."""
  inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  return np.concatenate(
      [np.sin(position * inv_freq), np.cos(position * inv_freq)]
  )


def rel_shift(x: np.ndarray) -> np.ndarray:
  """y[i, j] = x[i, j + Q - 1 - i] on the defined entries, NaN elsewhere."""
  q_len, p_len = x.shape
  y = np.full((q_len, p_len), np.nan)
  for i in range(q_len):
    for j in range(p_len):
      col = j + q_len - 1 - i
      if col < p_len:
        y[i, j] = x[i, col]
  return y


def numpy_params(params: Any) -> dict[str, np.ndarray]:
  """Flattens an attention layer's (unboxed) params to float64 arrays."""
  p = params["params"]
  out = {
      name: np.asarray(p[name]["kernel"], np.float64)
      for name in ("query", "key", "value", "pos_key", "out")
  }
  for name in ("u", "v", "v_plus", "v_minus"):
    if name in p:
      out[name] = np.asarray(p[name], np.float64)
  return out


def relative_attention(
    p: dict[str, np.ndarray],
    x_q: np.ndarray,
    q_pos: np.ndarray,
    x_k: np.ndarray,
    k_pos: np.ndarray,
    visible: Callable[[int, int, int], bool],
    scheme: str,
) -> tuple[np.ndarray, np.ndarray]:
  """Relative attention, Eq. 6 (scheme 'xl') or Eq. 12 ('disentangled').

  A[i, j] = x_i Wq Wk x_j + x_i Wq WkR R + u WkE x_j + b WkR R, scaled by
  1/sqrt(dh), softmax over the visible j.

  Args:
      p: ``numpy_params`` output.
      x_q: [B, Q, D] query inputs; q_pos: [Q] their absolute positions.
      x_k: [B, K, D] key/value inputs; k_pos: [K] their positions.
      visible: visible(b, qi, kj) -> bool.
      scheme: 'xl' or 'disentangled'.

  Returns:
      (c [B, Q, H, dh] attention vectors, lse [B, Q, H] log-normalisers).
  """
  batch, q_len, d_model = x_q.shape
  k_len = x_k.shape[1]
  heads, head_dim = p["u"].shape
  c = np.zeros((batch, q_len, heads, head_dim))
  lse = np.zeros((batch, q_len, heads))
  for b in range(batch):
    for h in range(heads):
      for i in range(q_len):
        q = x_q[b, i] @ p["query"][:, h, :]
        scores, values = [], []
        for j in range(k_len):
          if not visible(b, i, j):
            continue
          k = x_k[b, j] @ p["key"][:, h, :]
          delta = q_pos[i] - k_pos[j]
          if scheme == "xl":
            r_vec = sinusoid(delta, d_model)
            bias = p["v"][h]
          else:
            r_vec = sinusoid(abs(delta), d_model)
            bias = p["v_plus"][h] if delta >= 0 else p["v_minus"][h]
          r = r_vec @ p["pos_key"][:, h, :]
          a = q @ k + q @ r + p["u"][h] @ k + bias @ r
          scores.append(a / math.sqrt(head_dim))
          values.append(x_k[b, j] @ p["value"][:, h, :])
        scores = np.array(scores)
        top = scores.max()
        total = np.exp(scores - top).sum()
        probs = np.exp(scores - top) / total
        c[b, i, h] = probs @ np.array(values)
        lse[b, i, h] = top + np.log(total)
  return c, lse


def output_projection(p: dict[str, np.ndarray], c: np.ndarray) -> np.ndarray:
  """W_o applied to concatenated heads: [B, L, H, dh] -> [B, L, D]."""
  return np.einsum("blhk,hkd->bld", c, p["out"])


def last(a: np.ndarray, length: int) -> np.ndarray:
  """The last ``length`` entries along axis 1."""
  return a[:, a.shape[1] - length :]


def interpolate(
    c_old: np.ndarray,
    d_old: np.ndarray,
    c_new: np.ndarray,
    d_new: np.ndarray,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Eq. 10-11 with s = exp(d), float64, and the convention that eps is
  added after dividing by exp(max(d_old, d_new)) (the authors' code).

  alpha = s_old / (s_old + s_new + eps * exp(max(d_old, d_new)))
  C     = alpha C_old + (1 - alpha) C_new
  d     = log(s_old + s_new)
  """
  s_old, s_new = np.exp(d_old), np.exp(d_new)
  alpha = s_old / (s_old + s_new + eps * np.exp(np.maximum(d_old, d_new)))
  c = alpha[..., None] * c_old + (1.0 - alpha[..., None]) * c_new
  return c, np.log(s_old + s_new), alpha


def lamemo_layer(
    p: dict[str, np.ndarray],
    x: np.ndarray,
    c_old: np.ndarray,
    d_old: np.ndarray,
    valid: np.ndarray,
    scheme: str,
    eps: float,
    mem_len: int,
    interpolate_memory: bool = True,
) -> dict[str, np.ndarray]:
  """One LaMemo layer from the paper (Eq. 6/12 and Eq. 7-11).

  Args:
      p: ``numpy_params`` output.
      x: [B, M + T, D] normed inputs of the M memory tokens then the T
          segment tokens, at positions 0 .. M + T - 1.
      c_old: [B, M, H, dh] memory vectors; d_old: [B, M, H] their
          log-normalisers; valid: [B, M] bool.
      scheme: 'xl' or 'disentangled'.
      eps: Eq. 11 epsilon.
      mem_len: slots in the new memory.
      interpolate_memory: False sets alpha = 0 (the memory becomes the
          look-ahead vectors and their log-normaliser).

  Returns:
      dict with y [B, M + T, D], alpha [B, M, H] and the new memory c, lse,
      valid.
  """
  batch, total, _ = x.shape
  m = c_old.shape[1]
  n = total - m
  pos = np.arange(total)

  def key_ok(b, j):
    return j >= m or bool(valid[b, j])

  # Causal attention of the segment (query i at position m + i).
  c_seg, d_seg = relative_attention(
      p,
      x[:, m:],
      pos[m:],
      x,
      pos,
      lambda b, i, j: j <= m + i and key_ok(b, j),
      scheme,
  )

  # Look-ahead (Eq. 7): X~ = [x_{tau-N+2}, ..., x_{tau+1}], the last N - 1
  # memory tokens and the first segment token (N = min(M, T) when M < T).
  width = min(m, n)
  window = np.arange(m - width + 1, m + 1)
  # softmax_nabla (Eq. 9): memory token i reads window positions j > i.
  c_la, d_la = relative_attention(
      p,
      x[:, :m],
      pos[:m],
      x[:, window],
      window,
      lambda b, i, w: window[w] > i and key_ok(b, window[w]),
      scheme,
  )

  if interpolate_memory:
    c_mem, d_mem, alpha = interpolate(c_old, d_old, c_la, d_la, eps)
  else:
    c_mem, d_mem, alpha = c_la, d_la, np.zeros_like(d_la)
  c_mem = np.where(valid[:, :, None, None], c_mem, 0.0)
  d_mem = np.where(valid[:, :, None], d_mem, 0.0)
  alpha = np.where(valid[:, :, None], alpha, 0.0)

  c_all = np.concatenate([c_mem, c_seg], axis=1)
  d_all = np.concatenate([d_mem, d_seg], axis=1)
  v_all = np.concatenate([valid, np.ones((batch, n), bool)], axis=1)
  return dict(
      y=output_projection(p, c_all),
      alpha=alpha,
      c=last(c_all, mem_len),
      lse=last(d_all, mem_len),
      valid=last(v_all, mem_len),
  )
