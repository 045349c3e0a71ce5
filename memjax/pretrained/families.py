"""The pretrained families: a ``config.json`` as memjax model settings, and
a checkpoint's tensors as memjax's parameter tree.

Each family (by ``config.json``'s ``model_type``) is a set of options on
the decoder LM's parts (``docs/pretrained.md`` has the table):

* ``gpt2``: learned positions, pre-LayerNorm, the tanh GELU, biases
  everywhere, tied embeddings. Its Conv1D weights are stored [in, out],
  the transpose of ``nn.Linear``'s [out, in].
* ``llama``, ``mistral``, ``qwen2`` and ``qwen3``: rotary positions
  (``rope_theta``, Llama 3's rope scaling), RMSNorm, SwiGLU, grouped-query
  attention, tied or untied embeddings; q/k/v biases (Qwen2, or Llama's
  and Qwen3's ``attention_bias``, which biases the output projection
  too); Mistral's sliding window (``attention_options.sliding_window``);
  Qwen3's RMSNorm of each head's queries and keys
  (``attention_options.qk_norm``: ``query_norm``, ``key_norm`` [d_h]).

The tensors go into the tree ``decoder_lm`` makes: per layer
``layer_<i>/attention/{query,key,value}`` [D, H, d_h] (+ ``*_bias``
[H, d_h]), ``out`` [H, d_h, D] (+ ``out_bias``), ``{query,key}_norm``,
``ln_attn``, ``ln_ffn``, ``ffn``; ``embedder/embed_0`` [V, D] (+ ``output`` when untied),
``pos_embed``, ``final_norm``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

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


def _activation(name: str) -> str:
  if name not in ACTIVATIONS:
    raise errors.DataError(
        f"config.json's activation {name!r} is not supported; memjax takes "
        f"{', '.join(sorted(ACTIVATIONS))}"
    )
  return ACTIVATIONS[name]


def _base(layers: int, d: int, heads: int) -> Tree:
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


# ----------------------------------------------------------------------------
# GPT-2
# ----------------------------------------------------------------------------


def gpt2_settings(hf: dict[str, Any]) -> Tree:
  """``config.model`` of a GPT-2 config.json."""
  for key, ok in (
      ("scale_attn_by_inverse_layer_idx", False),
      ("scale_attn_weights", True),
      ("add_cross_attention", False),
  ):
    if hf.get(key, ok) != ok:
      raise errors.DataError(f"config.json sets {key}, which memjax lacks")
  d, heads = int(get(hf, "n_embd")), int(get(hf, "n_head"))
  return dict(
      _base(get(hf, "n_layer"), d, heads),
      head_dim=d // heads,
      d_ff=int(hf.get("n_inner") or 4 * d),
      max_len=int(get(hf, "n_positions")),
      norm_epsilon=float(get(hf, "layer_norm_epsilon", 1e-5)),
      activation=_activation(get(hf, "activation_function", "gelu_new")),
      feed_forward="ffn",
      feed_forward_options={"activation_dropout": 0.0},
      attention_options={"qkv_bias": True, "out_bias": True},
      family_options={
          "positions": "learned",
          "norm": "layer",
          "tie_embeddings": bool(hf.get("tie_word_embeddings", True)),
      },
  )


def gpt2_params(m: Tree, take: Callable[..., np.ndarray]) -> Tree:
  """The parameter tree of a GPT-2 checkpoint.

  Args:
    m: the model settings (``gpt2_settings``) and ``vocab_size``.
    take: ``take(name, shape)`` reads a tensor (``taker``).
  """
  d, h, f, v = m["d_model"], m["num_heads"], m["d_ff"], m["vocab_size"]
  dh = d // h
  tree: Tree = {
      "embedder": {"embed_0": take("wte.weight", (v, d))},
      "pos_embed": take("wpe.weight", (m["max_len"], d)),
      "final_norm": {
          "scale": take("ln_f.weight", (d,)),
          "bias": take("ln_f.bias", (d,)),
      },
  }
  if not m["family_options"]["tie_embeddings"]:
    tree["embedder"]["output"] = take("lm_head.weight", (v, d))
  for i in range(m["num_layers"]):
    p = f"h.{i}."
    # Conv1D weights are [in, out]: [D, 3D] here, q, k and v side by side.
    qkv = take(p + "attn.c_attn.weight", (d, 3 * d))
    qkv_b = take(p + "attn.c_attn.bias", (3 * d,))
    attn = {}
    for j, name in enumerate(("query", "key", "value")):
      attn[name] = qkv[:, j * d : (j + 1) * d].reshape(d, h, dh)
      attn[name + "_bias"] = qkv_b[j * d : (j + 1) * d].reshape(h, dh)
    attn["out"] = take(p + "attn.c_proj.weight", (d, d)).reshape(h, dh, d)
    attn["out_bias"] = take(p + "attn.c_proj.bias", (d,))
    ln = {
        name: {
            "scale": take(f"{p}{n}.weight", (d,)),
            "bias": take(f"{p}{n}.bias", (d,)),
        }
        for name, n in (("ln_attn", "ln_1"), ("ln_ffn", "ln_2"))
    }
    ffn = {
        name: {
            "kernel": take(f"{p}mlp.{n}.weight", shape),
            "bias": take(f"{p}mlp.{n}.bias", shape[1:]),
        }
        for name, n, shape in (("wi", "c_fc", (d, f)), ("wo", "c_proj", (f, d)))
    }
    tree[f"layer_{i}"] = {"attention": attn, "ffn": ffn, **ln}
  return tree


# ----------------------------------------------------------------------------
# Llama and Qwen2
# ----------------------------------------------------------------------------


# config.json's rope types memjax takes.
ROPE_TYPES = ("default", "linear", "llama3")


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
        rope_scaling_factor=float(rope["factor"]),
        rope_scaling_type="linear",
    )
  return dict(
      out,
      rope_scaling_factor=float(rope["factor"]),
      rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
      rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
      rope_original_max_len=int(rope["original_max_position_embeddings"]),
  )


def llama_settings(hf: dict[str, Any]) -> Tree:
  """``config.model`` of a Llama, Mistral, Qwen2 or Qwen3 config.json."""
  kind = hf.get("model_type")
  if hf.get("mlp_bias") or (
      kind in ("qwen2", "qwen3") and hf.get("use_sliding_window")
  ):
    raise errors.DataError(
        "config.json sets mlp_bias or use_sliding_window, which memjax lacks"
    )
  d, heads = int(get(hf, "hidden_size")), int(get(hf, "num_attention_heads"))
  bias = bool(hf.get("attention_bias", False))
  eps = float(get(hf, "rms_norm_eps", 1e-6))
  attention = dict(
      rope_options(hf),
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      # Qwen2 biases q, k and v always and never the output.
      qkv_bias=kind == "qwen2" or bias,
      out_bias=bias and kind != "qwen2",
      **_window(hf),
  )
  if kind == "qwen3":
    attention.update(qk_norm="rms", qk_norm_epsilon=eps)
  return dict(
      _base(get(hf, "num_hidden_layers"), d, heads),
      head_dim=int(hf.get("head_dim") or d // heads),
      d_ff=int(get(hf, "intermediate_size")),
      max_len=int(get(hf, "max_position_embeddings", 4096)),
      norm_epsilon=eps,
      activation=_activation(get(hf, "hidden_act", "silu")),
      feed_forward="glu",
      feed_forward_options={},
      attention_options=attention,
      family_options={
          "positions": "none",
          "norm": "rms",
          "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
      },
  )


def _window(hf: dict[str, Any]) -> Tree:
  """Mistral's ``sliding_window`` (every layer; null = none) as the
  attention's option, or nothing."""
  if hf.get("model_type") != "mistral" or not hf.get("sliding_window"):
    return {}
  return {"sliding_window": int(hf["sliding_window"])}


def llama_params(m: Tree, take: Callable[..., np.ndarray]) -> Tree:
  """The parameter tree of a Llama, Mistral, Qwen2 or Qwen3 checkpoint.

  Args:
    m: the model settings (``llama_settings``) and ``vocab_size``.
    take: ``take(name, shape)`` reads a tensor (``taker``).
  """
  d, h, dh, f = m["d_model"], m["num_heads"], m["head_dim"], m["d_ff"]
  v = m["vocab_size"]
  kv = m["attention_options"]["num_kv_heads"]
  tree: Tree = {
      "embedder": {"embed_0": take("embed_tokens.weight", (v, d))},
      "final_norm": {"scale": take("norm.weight", (d,))},
  }
  if not m["family_options"]["tie_embeddings"]:
    tree["embedder"]["output"] = take("lm_head.weight", (v, d))
  qkv_bias = m["attention_options"]["qkv_bias"]
  for i in range(m["num_layers"]):
    p = f"layers.{i}."
    attn = {}
    for name, proj, heads in (
        ("query", "q_proj", h),
        ("key", "k_proj", kv),
        ("value", "v_proj", kv),
    ):
      w = take(
          f"{p}self_attn.{proj}.weight", (heads * dh, d)
      )  # [heads * dh, D]
      attn[name] = w.reshape(heads, dh, d).transpose(2, 0, 1)
      if qkv_bias:
        attn[name + "_bias"] = take(
            f"{p}self_attn.{proj}.bias", (heads * dh,)
        ).reshape(heads, dh)
    attn["out"] = take(p + "self_attn.o_proj.weight", (d, h * dh)).T.reshape(
        h, dh, d
    )
    if m["attention_options"]["out_bias"]:
      attn["out_bias"] = take(p + "self_attn.o_proj.bias", (d,))
    if m["attention_options"].get("qk_norm", "none") != "none":
      for name, n in (("query_norm", "q_norm"), ("key_norm", "k_norm")):
        attn[name] = {"scale": take(f"{p}self_attn.{n}.weight", (dh,))}
    tree[f"layer_{i}"] = {
        "attention": attn,
        "ln_attn": {"scale": take(p + "input_layernorm.weight", (d,))},
        "ln_ffn": {"scale": take(p + "post_attention_layernorm.weight", (d,))},
        "ffn": {
            k: {"kernel": take(f"{p}mlp.{k}_proj.weight", shape).T}
            for k, shape in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f)))
        },
    }
  return tree


# model_type -> (settings, params, the tensors' name prefix).
FAMILIES: dict[str, tuple[Callable[..., Tree], Callable[..., Tree], str]] = {
    "gpt2": (gpt2_settings, gpt2_params, "transformer."),
    "llama": (llama_settings, llama_params, "model."),
    "mistral": (llama_settings, llama_params, "model."),
    "qwen2": (llama_settings, llama_params, "model."),
    "qwen3": (llama_settings, llama_params, "model."),
}


def family_of(hf: dict[str, Any]) -> tuple[Callable, Callable, str]:
  """The family of a config.json (by its ``model_type``).

  Raises:
    errors.DataError: an unsupported model_type.
  """
  kind = hf.get("model_type")
  if kind not in FAMILIES:
    raise errors.DataError(
        f"config.json's model_type {kind!r} is not supported; memjax imports "
        f"{', '.join(sorted(FAMILIES))}"
    )
  return FAMILIES[kind]


def taker(
    tensors: dict[str, np.ndarray], prefix: str, used: set[str]
) -> Callable[..., np.ndarray]:
  """``take(name, shape)``: the tensor ``prefix + name`` or ``name`` as
  float32, checked to have ``shape``, noted in ``used``.

  Raises:
    errors.DataError: the checkpoint lacks it, or it has another shape.
  """

  def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
    for key in (prefix + name, name):
      if key in tensors:
        used.add(key)
        if tuple(tensors[key].shape) != tuple(shape):
          raise errors.DataError(
              f"the checkpoint's {key} has shape {tuple(tensors[key].shape)} "
              f"but config.json makes it {tuple(shape)}: the config.json and "
              "the safetensors files are of different models"
          )
        return np.asarray(tensors[key], np.float32)
    raise errors.DataError(
        f"the checkpoint has no tensor {prefix + name}: the safetensors "
        "files are not this config.json's model, or are damaged"
    )

  return take
