"""Product-key memory's mode settings, added to ``memjax.config.base_config``."""

import ml_collections


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds ``memory_usage`` to the base config ``c``."""
  # --mode=memory_usage: MU, top-1 MU, KL_u, KL_w of each product-key
  # memory over held-out data, in windows of eval.window_len.
  c.memory_usage = ml_collections.ConfigDict()
  c.memory_usage.split = "valid"
  c.memory_usage.max_tokens = 0  # 0 = the whole split
  # Also every kept checkpoint: slots last used as top-1 at each (Figure 2).
  c.memory_usage.staleness = False
  # How reads u' and top-1s t' count: token = once per token (Kim & Jung's
  # t'_i, the argmax of the weights summed over heads); head = every head's.
  c.memory_usage.count = "token"
