"""FLOPs per token of modified MARGE beyond ``--mode=plan``'s formula.

The plan's formula counts every parameter once per target position,
forward and backward (6 N), and the decoder's self-attention (12 n_layer T
d_attn). ``model.MargeLM.forward`` also encodes, for each row of T
positions, its K retrieved sources of S positions each with the lower half
of the stack (``encode_sources``: the sources' embedding, the lower
``L_low`` layers and ``embed_norm``, gradients included), and attends to
their K S tokens in the cross-attention layers. Per target token, with a
product of a [m, k] and a [k, n] matrix 2 m k n FLOPs forward and twice
that backward:

* the sources' encoding: K S / T source positions per target position,
  each through the lower half, 6 (K S / T) (N_low + N_proj) for its
  parameters (the lower layers' and the adaptive input's projections; the
  tables are gathered) and 12 L_low S d_attn (K S / T) for its causal
  self-attention over S positions;
* the cross-attention (``BiasedCrossAttention``), per cross layer: keys
  and values of the K S source tokens, 12 (K S / T) D d_attn where the
  formula counts 12 D d_attn, and the scores and weighted sum over K S
  tokens, 12 K S d_attn.

The similarity bias, the pooling and the masks are a few FLOPs per score
or per source, left out.
"""

from __future__ import annotations

from typing import Any

from memjax import extend


def marge_flops(s: Any, shape: extend.FlopsShape) -> dict[str, float]:
  """FLOPs per token of MARGE's sources and cross-attention beyond the
  plan's formula (see the module doc); {} for another model family."""
  m = s.model
  if m.family != "marge":
    return {}
  opts = m.family_options
  layers, d_model = int(m.num_layers), int(m.d_model)
  d_attn = int(m.num_heads) * int(m.head_dim)
  half = max(1, layers // 2)
  cross_layers = tuple(opts.get("cross_layers", ())) or tuple(
      range(half + 1, layers + 1)
  )
  source_len = 2 * int(opts.get("segment_len", 16))
  sources = int(opts.get("num_sources", 4)) * source_len
  per_token = sources / shape.seq_len
  cross_params = 4 * d_model * d_attn + 2 * d_model  # projections, ln_cross
  # Every non-embedding parameter but the cross-attentions' and the three
  # norms outside the blocks (final_norm, embed_norm: scale and bias) and
  # beta lies in the blocks, one layer's share each.
  block = (
      shape.num_params
      - shape.softmax_params
      - len(cross_layers) * cross_params
      - 4 * d_model
      - 1
  ) / layers
  encode = 6.0 * per_token * (half * block + shape.projection_params)
  encode += 12.0 * half * source_len * d_attn * per_token
  cross = len(cross_layers) * (
      12.0 * (per_token - 1.0) * d_model * d_attn + 12.0 * sources * d_attn
  )
  return {"sources through the lower half": encode, "cross-attention": cross}
