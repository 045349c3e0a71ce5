"""FLOPs per token of product-key memories against ``--mode=plan``'s formula.

The plan's formula counts every parameter once per token, forward and
backward (6 N). A memory layer (``layer.ProductKeyMemory``) does that for
its query network (``query``, ``query_norm``; and Memory+'s gate) and for
its sub-keys: each head scores the two halves of its query against the C
sub-keys of each half, 2 C (k_dim / 2) FLOPs a half forward, 6 H C k_dim
with the backward pass, which is 6 times the H C k_dim sub-key parameters.
Its values are not multiplied with every token: each head reads its top k
of the C^2 rows (``bag.read``, ``sharded.read``), a weighted sum of H k
rows of V, 2 H k V FLOPs forward and twice that backward (the weights' and
the read rows' gradients). So, per memory layer and token, the formula's
6 C^2 V for the values table becomes 6 H k V.

The top-k selections, the k^2 candidate sums and the softmax over k are a
few operations per candidate, left out.
"""

from __future__ import annotations

from typing import Any

from memjax import extend
from memjax.methods.pkm import layer

KINDS = ("pkm", "resm", "memory_plus")


def memory_flops(s: Any, shape: extend.FlopsShape) -> dict[str, float]:
  """The values read instead of the whole tables (see the module doc);
  {} for a run without memory layers."""
  del shape  # Every term is per token.
  m = s.model
  if m.feed_forward not in KINDS:
    return {}
  opts = dict(m.feed_forward_options or {})
  defaults = layer.MemoryOptions
  slots = int(opts.get("num_keys", defaults.num_keys)) ** 2
  heads = int(opts.get("heads", defaults.heads))
  topk = int(opts.get("topk", defaults.topk))
  value_dim = int(m.d_model)
  layers = len(tuple(m.feed_forward_layers)) or int(m.num_layers)
  tables = 1 if opts.get("shared_values") else layers
  return {
      "memory values read": 6.0 * layers * heads * topk * value_dim,
      "memory values not read": -6.0 * tables * slots * value_dim,
  }
