"""Product-key memories in ``--mode=plan``'s formula: the values read, not
the whole tables, counted by hand on the smoke size (layers 1 and 2 hold
memories of 8^2 slots of 32 values, 2 heads, k = 2)."""

from configs import pkm_bert
from memjax import build
from memjax import extend
from memjax.methods.pkm import flops


def _settings(config):
  return build.read(config, build.parts())


def test_values_read_by_hand():
  config = pkm_bert.get_config("pkm_smoke")
  shape = extend.FlopsShape(seq_len=16, rows=4)
  got = flops.memory_flops(_settings(config), shape)
  # Per token and memory layer: 2 heads x k = 2 rows of 32 values, a
  # weighted sum (2 FLOPs a value) and its two gradients.
  assert got["memory values read"] == 2 * 6 * 2 * 2 * 32
  # The formula's 6 N counted both 64 x 32 tables for every token.
  assert got["memory values not read"] == -2 * 6 * 64 * 32
  config.model.feed_forward_options.shared_values = True
  got = flops.memory_flops(_settings(config), shape)
  assert got["memory values not read"] == -6 * 64 * 32  # one shared table
  assert (
      flops.memory_flops(_settings(pkm_bert.get_config("smoke")), shape) == {}
  )
