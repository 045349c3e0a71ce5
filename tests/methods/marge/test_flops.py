"""MARGE's FLOP terms of ``--mode=plan``'s formula, against a count worked
by hand from ``model.py`` on the smoke size (2 layers, D = 32, 2 heads x
16, segments of N = 8, windows of T = 16, K = 2 sources of S = 16)."""

from configs import marge_wt103
from configs import trime_wt103
from memjax import build
from memjax import extend
from memjax.methods.marge import flops

D, DA, T, S, K = 32, 32, 16, 16, 2


def _settings(config):
  return build.read(config, build.parts())


def test_sources_and_cross_attention_by_hand():
  s = _settings(marge_wt103.get_config("smoke"))
  block, softmax, projections = 10_000, 50_000, 3_000
  cross = 4 * D * DA + 2 * D  # layer 2's query, key, value, out, ln_cross
  outside = 4 * D + 1  # final_norm, embed_norm, beta
  shape = extend.FlopsShape(
      seq_len=T,
      rows=8,
      softmax_params=softmax,
      projection_params=projections,
      num_params=softmax + 2 * block + cross + outside,
  )
  got = flops.marge_flops(s, shape)
  # K S / T = 2 source positions per target position, each through layer 1
  # (its block and the input projections; its self-attention over S).
  encode = 6 * 2 * (block + projections) + 12 * S * DA * 2
  assert got["sources through the lower half"] == encode
  # Layer 2: keys and values of K S = 32 tokens (12 D d each, one of them
  # in 6 N), scores and weighted sum over 32 keys.
  assert got["cross-attention"] == 12 * (2 - 1) * D * DA + 12 * 32 * DA
  plain = _settings(trime_wt103.get_config("smoke"))
  assert flops.marge_flops(plain, shape) == {}
