"""Gemma 3's language model as memjax settings and parameters.

``gemma3_text`` (Gemma3ForCausalLM: 270M, 1B) and ``gemma3``
(Gemma3ForConditionalGeneration: 4B and up, its language model's keys
nested under ``text_config`` and its tensors under
``language_model.model.``; the vision tower is left unused). Gemma 3 is
a set of options on the decoder LM's parts (``docs/pretrained.md``):

* RMSNorm scaled by (1 + w) (``family_options.norm='rms_plus_one'``), four
  a block: ``input_layernorm`` -> ``ln_attn``, ``post_attention_layernorm``
  -> ``ln_attn_post`` (on the attention's output), ``pre_feedforward_
  layernorm`` -> ``ln_ffn``, ``post_feedforward_layernorm`` ->
  ``ln_ffn_post`` (``family_options.post_norms``);
* each head's queries and keys normalised so (``attention_options.qk_norm
  ='rms_plus_one'``), scores divided by sqrt(``query_pre_attn_scalar``);
* embeddings times sqrt(hidden size) (``model.scale_embedding``), tied;
* GeGLU: ``glu`` with the tanh GELU (``gelu_pytorch_tanh``);
* local and global layers (``layer_types``, or the Hub's older
  ``sliding_window_pattern``: every n-th layer global): the global
  layers take ``attention_options`` (``rope_theta``, the linear rope
  scaling of 4B+), the local ones ``family_options.local_layers`` and
  ``local_attention_options`` (the ``sliding_window`` and their own
  rotary base, ``rope_local_base_freq``).

Both forms of the rotary settings are read: transformers 5's
``rope_parameters`` per layer type (``sliding_attention``,
``full_attention``) and the Hub's ``rope_theta``, ``rope_local_base_freq``
and ``rope_scaling`` (the global layers'). The (1 + w) of the norms is the
model's: the tensors are moved, never computed on.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from memjax import errors
from memjax.pretrained import families
from memjax.pretrained import hf_config

Tree = dict[str, Any]
# Gemma3TextConfig's defaults, which the Hub's config.json files leave out
# (a 4B+ text_config names only its sizes).
DEFAULTS: Tree = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}
LAYER_TYPES = ("sliding_attention", "full_attention")
# Settings of Gemma 2 and others that Gemma 3 leaves unset.
REFUSED = (
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "use_bidirectional_attention",
)


def text(hf: Tree) -> Tree:
  """The language model's keys: a ``gemma3`` config.json's ``text_config``
  (its bos/eos ids and tying from the top level where it has none), or a
  ``gemma3_text`` one's own, over Gemma3TextConfig's defaults.

  Raises:
    errors.DataError: a ``gemma3`` config.json without ``text_config``.
  """
  own = hf
  if hf.get("model_type") == "gemma3":
    own = hf.get("text_config")
    if not isinstance(own, dict):
      raise errors.DataError(
          "config.json of model_type 'gemma3' has no text_config"
      )
  given = {k: v for k, v in own.items() if v is not None}
  for key in ("bos_token_id", "eos_token_id", "tie_word_embeddings"):
    if key not in given and hf.get(key) is not None:
      given[key] = hf[key]
  return dict(DEFAULTS, **given)


def layer_types(hf: Tree) -> list[str]:
  """Each layer's type: ``layer_types``, else every
  ``sliding_window_pattern``-th layer global (Gemma3TextConfig's rule).

  Raises:
    errors.DataError: a list of another length or an unknown type.
  """
  n = int(hf_config.get(hf, "num_hidden_layers"))
  if hf.get("layer_types"):
    types = list(hf["layer_types"])
    if len(types) != n or set(types) - set(LAYER_TYPES):
      raise errors.DataError(
          f"config.json's layer_types must give each of the {n} layers one "
          f"of {', '.join(LAYER_TYPES)}, got {types}"
      )
    return types
  pattern = int(hf_config.get(hf, "sliding_window_pattern"))
  return [LAYER_TYPES[(i + 1) % pattern == 0] for i in range(n)]


def _ropes(hf: Tree) -> tuple[Tree, Tree]:
  """The rotary options of the global and of the local layers."""
  params = hf.get("rope_parameters") or {}
  if set(params) & set(LAYER_TYPES):  # transformers 5: one per type.
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
  else:  # The Hub's: the global layers' scaling, the local base.
    full = dict(params or hf.get("rope_scaling") or {})
    local = {"rope_theta": hf["rope_local_base_freq"]}
  full.setdefault("rope_theta", hf["rope_theta"])
  local.setdefault("rope_theta", hf["rope_local_base_freq"])
  return hf_config.rope_options(hf, full), hf_config.rope_options(hf, local)


def _local_options(hf: Tree, attention: Tree, rope: Tree) -> Tree:
  """The local layers' attention options that differ from ``attention``
  (the global layers'): the window and their rotary settings."""
  local = dict(rope, sliding_window=int(hf_config.get(hf, "sliding_window")))
  if "rope_scaling_factor" in attention:
    local.setdefault("rope_scaling_factor", 0.0)
  return {k: v for k, v in local.items() if attention.get(k) != v}


def gemma3_settings(hf: Tree) -> Tree:
  """``config.model`` of a Gemma 3 language model's keys (``text``).

  Raises:
    errors.DataError: a setting memjax lacks (softcapping, bidirectional
      attention), a rope type it lacks, bad layer types.
  """
  for key in REFUSED:
    if hf.get(key):
      raise errors.DataError(
          f"config.json sets {key}, which memjax lacks (Gemma 3 sets none)"
      )
  d = int(hf_config.get(hf, "hidden_size"))
  heads = int(hf_config.get(hf, "num_attention_heads"))
  eps = float(hf_config.get(hf, "rms_norm_eps"))
  bias = bool(hf.get("attention_bias"))
  full, local_rope = _ropes(hf)
  attention = dict(
      full,
      num_kv_heads=int(hf_config.get(hf, "num_key_value_heads")),
      qkv_bias=bias,
      out_bias=bias,
      qk_norm="rms_plus_one",
      qk_norm_epsilon=eps,
      query_pre_attn_scalar=float(hf_config.get(hf, "query_pre_attn_scalar")),
  )
  types = layer_types(hf)
  family = {
      "positions": "none",
      "norm": "rms_plus_one",
      "tie_embeddings": bool(hf["tie_word_embeddings"]),
      "post_norms": True,
  }
  local_layers = [i + 1 for i, t in enumerate(types) if t == LAYER_TYPES[0]]
  if local_layers:
    family["local_layers"] = local_layers
    family["local_attention_options"] = _local_options(
        hf, attention, local_rope
    )
  return dict(
      hf_config.base(len(types), d, heads),
      scale_embedding=True,
      head_dim=int(hf_config.get(hf, "head_dim")),
      d_ff=int(hf_config.get(hf, "intermediate_size")),
      max_len=int(hf_config.get(hf, "max_position_embeddings")),
      norm_epsilon=eps,
      activation=hf_config.activation(hf_config.get(hf, "hidden_activation")),
      feed_forward="glu",
      feed_forward_options={},
      attention_options=attention,
      family_options=family,
  )


def gemma3_params(m: Tree, take: Callable[..., np.ndarray]) -> Tree:
  """The parameter tree of a Gemma 3 language model's tensors.

  Args:
    m: the model settings (``gemma3_settings``) and ``vocab_size``.
    take: ``take(name, shape)`` reads a tensor (``registry.taker``).
  """
  d = m["d_model"]
  tree = families.embedding_params(m, take)
  for i in range(m["num_layers"]):
    p = f"layers.{i}."
    layer = {
        "attention": families.attention_params(m, take, p),
        "ffn": families.glu_params(m, take, p),
    }
    for name, n in (
        ("ln_attn", "input_layernorm"),
        ("ln_attn_post", "post_attention_layernorm"),
        ("ln_ffn", "pre_feedforward_layernorm"),
        ("ln_ffn_post", "post_feedforward_layernorm"),
    ):
      layer[name] = {"scale": take(f"{p}{n}.weight", (d,))}
    tree[f"layer_{i}"] = layer
  return tree
