"""Reading a Hugging Face ``config.json``: its keys, activation names, the
settings every pretrained family shares, and the rotary settings in both
of its formats (``rope_parameters``, transformers 5; ``rope_theta`` and
``rope_scaling``, earlier and most of the Hub's).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from memjax import errors

Tree = dict[str, Any]
# Hugging Face's activation names -> ``model.activation``.
ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def get(hf: dict[str, Any], key: str, default: Any = None) -> Any:
  """config.json's ``key``; an absent key without a default is an error."""
  if key in hf and hf[key] is not None:
    return hf[key]
  if default is None:
    raise errors.DataError(f"config.json has no {key}")
  return default


def activation(name: str) -> str:
  """``model.activation`` of Hugging Face's activation ``name``.

  Raises:
    errors.DataError: one memjax lacks.
  """
  if name not in ACTIVATIONS:
    raise errors.DataError(
        f"config.json's activation {name!r} is not supported; memjax takes "
        f"{', '.join(sorted(ACTIVATIONS))}"
    )
  return ACTIVATIONS[name]


def base(layers: int, d: int, heads: int) -> Tree:
  """The settings every pretrained family shares."""
  return dict(
      family="decoder_lm",
      num_layers=int(layers),
      d_model=int(d),
      num_heads=int(heads),
      cutoffs=(),
      scale_embedding=False,
      dropout=0.0,
      adaptive_dropout=0.0,
      attention_dropout=0.0,
      attention="vanilla",
      mem_len=0,
      norm_position="pre",
      final_layer_norm=True,
      feed_forward_layers=(),
  )


# config.json's rope types memjax takes.
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_options(hf: dict[str, Any], rope: Optional[Tree] = None) -> Tree:
  """The attention's rotary options of a config.json: ``rope_parameters``
  (transformers 5) or ``rope_theta`` and ``rope_scaling`` (earlier), or of
  ``rope`` (one layer type's ``rope_parameters``, Gemma 3's) if given.

  Raises:
    errors.DataError: a rope type memjax lacks, or a partial rotation.
  """
  if rope is None:
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ROPE_TYPES:
    raise errors.DataError(
        f"config.json's rope type {kind!r} is not supported; memjax takes "
        f"{', '.join(map(repr, ROPE_TYPES))}"
    )
  partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
  if partial not in (None, 1, 1.0):
    raise errors.DataError(
        f"config.json's partial_rotary_factor {partial} is not supported; "
        "memjax rotates every feature of a head (1.0)"
    )
  out = {"rope_theta": float(theta)}
  if kind == "default":
    return out
  if kind == "linear":
    return dict(
        out,
        rope_scaling_factor=float(get(rope, "factor")),
        rope_scaling_type="linear",
    )
  if kind == "yarn":
    return dict(out, **_yarn(hf, rope))
  return dict(
      out,
      rope_scaling_factor=float(get(rope, "factor")),
      rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
      rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
      rope_original_max_len=int(get(rope, "original_max_position_embeddings")),
  )


def _mscale(factor: float, mscale: float = 1.0) -> float:
  """YaRN's attention-factor term (Hugging Face's ``get_mscale``)."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(hf: dict[str, Any], rope: Tree) -> Tree:
  """YaRN's options, read as Hugging Face's ``_compute_yarn_parameters``
  and ``standardize_rope_params`` read them: the original length from the
  top level, the rope settings or ``max_position_embeddings``; a missing
  factor their ratio; a missing attention factor from ``mscale``."""
  original = int(
      hf.get("original_max_position_embeddings")
      or rope.get("original_max_position_embeddings")
      or get(hf, "max_position_embeddings")
  )
  factor = rope.get("factor")
  if factor is None:
    factor = get(hf, "max_position_embeddings") / original
  attention = rope.get("attention_factor")
  if attention is None:
    mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
    if mscale and mscale_all:
      attention = _mscale(factor, mscale) / _mscale(factor, mscale_all)
    else:
      attention = _mscale(factor)
  return {
      "rope_scaling_factor": float(factor),
      "rope_scaling_type": "yarn",
      "rope_original_max_len": original,
      "rope_beta_fast": float(rope.get("beta_fast") or 32),
      "rope_beta_slow": float(rope.get("beta_slow") or 1),
      "rope_truncate": bool(rope.get("truncate", True)),
      "rope_attention_factor": float(attention),
  }
