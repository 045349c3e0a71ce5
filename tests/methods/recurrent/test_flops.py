"""The relative attentions' FLOP terms of ``--mode=plan``'s formula, against
counts worked by hand from ``relative.py`` and ``lamemo.py`` on the smoke
sizes (2 layers, D = 32, 2 heads x 16, T = M = 16, 8 rows)."""

import pytest

from configs import lamemo_wt103
from configs import pkm_bert
from configs import trime_iwslt
from configs import txl_wt103
from memjax import build
from memjax import extend
from memjax.methods.recurrent import flops

L, D, DA, T, M, ROWS = 2, 32, 32, 16, 16, 8
K = M + T  # keys: memory and segment


def _settings(config):
  return build.read(config, build.parts())


def _relative_per_layer(biases: int) -> float:
  """One layer's relative-position FLOPs per token beyond the formula."""
  position = 6 * T * K * DA / T  # q . r over K distance columns
  content_bias = 6 * K * DA / T  # u . k, once per row
  table = (4 * K * D * DA + 6 * K * DA) / (ROWS * T)  # W_kR R and b . r
  counted = 6 * (D * DA + biases * DA)  # W_kR, u, v as 6 N counts them
  return position + content_bias + table - counted


def test_transformer_xl_terms_by_hand():
  s = _settings(txl_wt103.get_config("smoke"))
  got = flops.relative_flops(s, extend.FlopsShape(seq_len=T, rows=ROWS))
  # Per layer: 6144 + 384 + 1072 - 6528 = 1072.
  assert _relative_per_layer(2) == 1072
  assert got["relative positions"] == L * 1072
  # Keys and values of the M memory rows: 2 x 6 (M / T) D d per layer.
  assert got["memory key and value projections"] == L * 12 * 1 * D * DA
  assert len(got) == 2


def test_rpe_has_no_memory_terms():
  s = _settings(txl_wt103.get_config("rpe_smoke"))
  got = flops.relative_flops(s, extend.FlopsShape(seq_len=T, rows=ROWS))
  # No memory: K = T = 16 keys and distance columns; u, v_plus, v_minus.
  position, bias = 6 * T * DA, 6 * DA
  table = (4 * T * D * DA + 6 * T * DA) / (ROWS * T)
  counted = 6 * (D * DA + 3 * DA)
  assert got == {"relative positions": L * (position + bias + table - counted)}


def test_an_encoders_rpe_reads_both_directions():
  c = pkm_bert.get_config("pkm_smoke")
  c.model.attention = "rpe"
  s = _settings(c)
  m = s.model
  layers, d, da = m.num_layers, m.d_model, m.num_heads * m.head_dim
  got = flops.relative_flops(s, extend.FlopsShape(seq_len=T, rows=ROWS))
  # 2T - 1 distance columns (keys on both sides of every query), T keys.
  cols = 2 * T - 1
  position, bias = 6 * cols * da, 6 * da
  table = (4 * cols * d * da + 6 * cols * da) / (ROWS * T)
  counted = 6 * (d * da + 3 * da)
  want = layers * (position + bias + table - counted)
  assert got == {"relative positions": want}


def test_the_encoder_decoders_rpe_counts_both_stacks():
  c = trime_iwslt.get_config("smoke")
  c.model.attention = "rpe"
  c.model.family_options.encoder_layers = 3
  s = _settings(c)
  m = s.model
  d, da = m.d_model, m.num_heads * m.head_dim
  got = flops.relative_flops(s, extend.FlopsShape(seq_len=T, rows=ROWS))
  counted = 6 * (d * da + 3 * da)

  def stack(cols):  # T queries over T keys and ``cols`` distance columns.
    table = (4 * cols * d * da + 6 * cols * da) / (ROWS * T)
    return 6 * cols * da + 6 * da + table - counted

  # Encoder both ways (2T - 1 columns), decoder causal (T); the
  # cross-attention has no relative positions.
  want = 3 * stack(2 * T - 1) + m.num_layers * stack(T)
  assert got == {"relative positions": pytest.approx(want, rel=1e-12)}


def test_lamemo_terms_by_hand():
  s = _settings(lamemo_wt103.get_config("smoke"))
  block = 10_000  # one block's parameters besides W_kR and the biases
  softmax = 123_456
  shape = extend.FlopsShape(
      seq_len=T,
      rows=ROWS,
      softmax_params=softmax,
      num_params=softmax + L * (block + D * DA + 3 * DA),
  )
  got = flops.relative_flops(s, shape)
  assert got["relative positions"] == L * _relative_per_layer(3)
  # The M memory rows run through every block with the T segment rows.
  assert got["memory rows through the blocks"] == L * 6 * (M / T) * block
  # Look-ahead: M queries over W = 16 window keys, 31 distance columns:
  # QK^T and AV 12 * 16 * 16 * 32 / 16 = 6144, q . r 6 * 16 * 31 * 32 / 16
  # = 5952, u . k 6 * 16 * 32 / 16 = 192, the table (4 * 31 * 32 * 32 +
  # 6 * 31 * 32) / 128 = 1038.5.
  assert got["look-ahead"] == L * (6144 + 5952 + 192 + 1038.5)
  s_off = _settings(lamemo_wt103.get_config("no_lookahead_smoke"))
  assert "look-ahead" not in flops.relative_flops(s_off, shape)


def test_other_attention_kinds_add_nothing():
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top

  s = _settings(trime_wt103.get_config("smoke"))
  assert flops.relative_flops(s, extend.FlopsShape(seq_len=32, rows=8)) == {}
