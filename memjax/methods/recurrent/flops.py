"""FLOPs per token of the relative attentions beyond ``--mode=plan``'s formula.

The plan's formula is ``6 N + 12 n_layer (T + M) d_attn``: every parameter
once per token, forward and backward, and QK^T and AV over the T + M keys.
What ``relative.py`` and ``lamemo.py`` compute on top of that, per layer
and per token (T positions per row, M memory slots, K = M + T keys, D the
model width, d = heads x head_dim, B rows of a micro-batch; a product of
a [m, k] and a [k, n] matrix is 2 m k n FLOPs forward and twice that
backward):

* position scores q . r (``_scores``): [T, d] x [d, P] with P = K
  distance columns (causal), 6 P d;
* the content bias u . k: [K, d] x [d] per row, 6 K d / T; the position
  bias b . r: [P, d] x [d] per step, 6 P d / (B T);
* the projected positions r = W_kR R (``_position_table``): [P, D] x [D, d]
  once per step, not per row or token, forward and the weight's gradient
  (the sinusoids are constants), 4 P D d / (B T), where the formula counts
  W_kR's 6 D d per token (and u, v like parameters read per token);
* Transformer-XL: the key and value projections of the M memory rows
  (``key(concat(memory, segment))``: the product's input gradient is
  computed over all K rows, then dropped), 12 (M / T) D d;
* LaMemo: every block runs over the M memory rows and the T segment rows
  (the memory rows' states are recomputed per segment), so the blocks'
  parameters count (M + T) / T times, 6 (M / T) N_block; and the
  look-ahead (``_refresh``): M memory queries over a window of W = min(M,
  T) keys, content and values 12 M W d / T, positions over P' = W + M - 1
  columns 6 M P' d / T, its own projected positions 4 P' D d / (B T) and
  content bias 6 W d / T.

The interpolation (Eq. 10-11), the masks and the softmax are elementwise:
a few FLOPs per score, left out like the formula's own softmax.
"""

from __future__ import annotations

from typing import Any

from memjax import extend

# The attention kinds of this method and their bias vectors per layer
# (u and v, or u, v_plus and v_minus).
_BIASES = {"xl": 2, "rpe": 3, "lamemo": 3}


def _scores(
    queries: int,
    keys: int,
    cols: int,
    d_model: int,
    d_attn: int,
    tokens: int,
    step_tokens: int,
) -> float:
  """FLOPs per token, forward and backward, of the relative terms of one
  ``_scores`` call: ``queries`` over ``keys`` with ``cols`` distance
  columns, for ``tokens`` positions per row and ``step_tokens`` per step.
  """
  position = 6.0 * queries * cols * d_attn / tokens
  content_bias = 6.0 * keys * d_attn / tokens
  table = (4.0 * cols * d_model * d_attn + 6.0 * cols * d_attn) / step_tokens
  return position + content_bias + table


def _seq2seq_flops(s: Any, shape: extend.FlopsShape) -> dict[str, float]:
  """The encoder-decoder's 'rpe' (the one relative kind it takes): its
  encoder's self-attention reads both directions (2S - 1 distance columns
  over S keys, S = T in the plan's padded batches), its decoder's causal
  self-attention T columns over T keys; the cross-attention has no
  relative positions. Per target token, each stack's layers."""
  m = s.model
  d_model, d_attn = int(m.d_model), int(m.num_heads) * int(m.head_dim)
  t, step_tokens = shape.seq_len, shape.rows * shape.seq_len
  counted = 6.0 * (d_model * d_attn + _BIASES[m.attention] * d_attn)
  encoder = int(dict(m.family_options).get("encoder_layers", m.num_layers))
  enc = _scores(t, t, 2 * t - 1, d_model, d_attn, t, step_tokens)
  dec = _scores(t, t, t, d_model, d_attn, t, step_tokens)
  return {
      "relative positions": encoder * (enc - counted)
      + int(m.num_layers) * (dec - counted)
  }


def relative_flops(s: Any, shape: extend.FlopsShape) -> dict[str, float]:
  """FLOPs per token of the relative attentions beyond the plan's formula
  (see the module doc); {} for a run with another attention kind. The
  encoder's 'rpe' reads both directions: 2T - 1 distance columns; the
  encoder-decoder's, ``_seq2seq_flops``."""
  m = s.model
  if m.attention not in _BIASES:
    return {}
  if m.family == "encoder_decoder":
    return _seq2seq_flops(s, shape)
  if m.family not in ("decoder_lm", "encoder"):
    return {}
  layers, d_model = int(m.num_layers), int(m.d_model)
  d_attn = int(m.num_heads) * int(m.head_dim)
  t, mem = shape.seq_len, int(m.mem_len)
  keys = t + mem
  cols = 2 * t - 1 if m.family == "encoder" else keys
  step_tokens = shape.rows * t
  # W_kR and the biases, counted by 6 N as if read per token.
  counted = 6.0 * (d_model * d_attn + _BIASES[m.attention] * d_attn)
  out = {
      "relative positions": layers
      * (_scores(t, keys, cols, d_model, d_attn, t, step_tokens) - counted)
  }
  if m.attention == "xl" and mem:
    out["memory key and value projections"] = (
        layers * 12.0 * mem / t * d_model * d_attn
    )
  if m.attention == "lamemo" and mem:
    block = (shape.num_params - shape.softmax_params) / layers - (
        d_model * d_attn + _BIASES["lamemo"] * d_attn
    )
    out["memory rows through the blocks"] = layers * 6.0 * mem / t * block
    if m.attention_options.get("look_ahead", True):
      width = min(mem, t)
      cols = width + mem - 1
      look = 12.0 * mem * width * d_attn / t
      look += _scores(mem, width, cols, d_model, d_attn, t, step_tokens)
      out["look-ahead"] = layers * look
  return out
