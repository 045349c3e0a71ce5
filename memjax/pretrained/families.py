"""The GPT-2 and Llama-like pretrained families: a ``config.json`` as
memjax model settings, and a checkpoint's tensors as memjax's parameter
tree (Gemma 3 is ``gemma``; ``registry`` names them by ``model_type``).

Each family (by ``config.json``'s ``model_type``) is a set of options on
the decoder LM's parts (``docs/pretrained.md`` has the table):

* ``gpt2``: learned positions, pre-LayerNorm, the tanh GELU, biases
  everywhere, tied embeddings. Its Conv1D weights are stored [in, out],
  the transpose of ``nn.Linear``'s [out, in].
* ``llama``, ``mistral``, ``qwen2`` and ``qwen3``: rotary positions
  (``rope_theta``; Llama 3's, linear or YaRN rope scaling), RMSNorm,
  SwiGLU, grouped-query attention, tied or untied embeddings; q/k/v
  biases (Qwen2, or Llama's and Qwen3's ``attention_bias``, which biases
  the output projection too); Mistral's sliding window
  (``attention_options.sliding_window``), and Qwen's on the layers from
  ``max_window_layers`` on (``family_options.local_layers``); Qwen3's
  RMSNorm of each head's queries and keys (``attention_options.qk_norm``:
  ``query_norm``, ``key_norm`` [d_h]).

The tensors go into the tree ``decoder_lm`` makes: per layer
``layer_<i>/attention/{query,key,value}`` [D, H, d_h] (+ ``*_bias``
[H, d_h]), ``out`` [H, d_h, D] (+ ``out_bias``), ``{query,key}_norm``,
``ln_attn``, ``ln_ffn``, ``ffn``; ``embedder/embed_0`` [V, D] (+
``output`` when untied), ``pos_embed``, ``final_norm``. The parameter
functions only move tensors (reshape, transpose, slice): never compute
on them.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from memjax import errors
from memjax.pretrained import hf_config

Tree = dict[str, Any]


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
  d, heads = int(hf_config.get(hf, "n_embd")), int(hf_config.get(hf, "n_head"))
  return dict(
      hf_config.base(hf_config.get(hf, "n_layer"), d, heads),
      head_dim=d // heads,
      d_ff=int(hf.get("n_inner") or 4 * d),
      max_len=int(hf_config.get(hf, "n_positions")),
      norm_epsilon=float(hf_config.get(hf, "layer_norm_epsilon", 1e-5)),
      activation=hf_config.activation(
          hf_config.get(hf, "activation_function", "gelu_new")
      ),
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
    take: ``take(name, shape)`` reads a tensor (``registry.taker``).
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


def llama_settings(hf: dict[str, Any]) -> Tree:
  """``config.model`` of a Llama, Mistral, Qwen2 or Qwen3 config.json."""
  kind = hf.get("model_type")
  if hf.get("mlp_bias"):
    raise errors.DataError("config.json sets mlp_bias, which memjax lacks")
  d, heads = int(hf_config.get(hf, "hidden_size")), int(
      hf_config.get(hf, "num_attention_heads")
  )
  bias = bool(hf.get("attention_bias", False))
  eps = float(hf_config.get(hf, "rms_norm_eps", 1e-6))
  attention = dict(
      hf_config.rope_options(hf),
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      # Qwen2 biases q, k and v always and never the output.
      qkv_bias=kind == "qwen2" or bias,
      out_bias=bias and kind != "qwen2",
      **_window(hf),
  )
  if kind == "qwen3":
    attention.update(qk_norm="rms", qk_norm_epsilon=eps)
  return dict(
      hf_config.base(hf_config.get(hf, "num_hidden_layers"), d, heads),
      head_dim=int(hf.get("head_dim") or d // heads),
      d_ff=int(hf_config.get(hf, "intermediate_size")),
      max_len=int(hf_config.get(hf, "max_position_embeddings", 4096)),
      norm_epsilon=eps,
      activation=hf_config.activation(hf_config.get(hf, "hidden_act", "silu")),
      feed_forward="glu",
      feed_forward_options={},
      attention_options=attention,
      family_options={
          "positions": "none",
          "norm": "rms",
          "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
          **_qwen_window(hf),
      },
  )


def _window(hf: dict[str, Any]) -> Tree:
  """Mistral's ``sliding_window`` (every layer; null = none) as the
  attention's option, or nothing."""
  if hf.get("model_type") != "mistral" or not hf.get("sliding_window"):
    return {}
  return {"sliding_window": int(hf["sliding_window"])}


def _qwen_window(hf: dict[str, Any]) -> Tree:
  """Qwen2's and Qwen3's ``use_sliding_window`` as family options: the
  layers ``layer_types`` marks 'sliding_attention' (by default those from
  ``max_window_layers`` on, 0-based) attend to the last ``sliding_window``
  positions; nothing without it."""
  if hf.get("model_type") not in ("qwen2", "qwen3"):
    return {}
  if not (hf.get("use_sliding_window") and hf.get("sliding_window")):
    return {}
  n = int(hf_config.get(hf, "num_hidden_layers"))
  start = int(hf_config.get(hf, "max_window_layers", n))
  types = hf.get("layer_types") or [
      "sliding_attention" if i >= start else "full_attention" for i in range(n)
  ]
  local = [i + 1 for i, t in enumerate(types) if t == "sliding_attention"]
  if not local:
    return {}
  return {
      "local_layers": local,
      "local_attention_options": {"sliding_window": int(hf["sliding_window"])},
  }


def attention_params(m: Tree, take: Callable[..., np.ndarray], p: str) -> Tree:
  """The attention tree of the layer whose tensors are named ``p`` +
  ``self_attn.*`` (Llama's layout, which Mistral, Qwen and Gemma share):
  q/k/v ``[heads * d_h, D]`` -> ``[D, heads, d_h]``, o ``[D, H * d_h]`` ->
  ``[H, d_h, D]``, their biases and q/k norms as the options have them."""
  d, h, dh = m["d_model"], m["num_heads"], m["head_dim"]
  options = m["attention_options"]
  kv = options["num_kv_heads"]
  attn = {}
  for name, proj, heads in (
      ("query", "q_proj", h),
      ("key", "k_proj", kv),
      ("value", "v_proj", kv),
  ):
    w = take(f"{p}self_attn.{proj}.weight", (heads * dh, d))
    attn[name] = w.reshape(heads, dh, d).transpose(2, 0, 1)
    if options["qkv_bias"]:
      attn[name + "_bias"] = take(
          f"{p}self_attn.{proj}.bias", (heads * dh,)
      ).reshape(heads, dh)
  o = take(p + "self_attn.o_proj.weight", (d, h * dh))
  attn["out"] = o.T.reshape(h, dh, d)
  if options["out_bias"]:
    attn["out_bias"] = take(p + "self_attn.o_proj.bias", (d,))
  if options.get("qk_norm", "none") != "none":
    for name, n in (("query_norm", "q_norm"), ("key_norm", "k_norm")):
      attn[name] = {"scale": take(f"{p}self_attn.{n}.weight", (dh,))}
  return attn


def glu_params(m: Tree, take: Callable[..., np.ndarray], p: str) -> Tree:
  """The gated feed-forward of the layer ``p``: ``mlp.{gate,up,down}_proj``
  ``[out, in]``, transposed."""
  d, f = m["d_model"], m["d_ff"]
  return {
      k: {"kernel": take(f"{p}mlp.{k}_proj.weight", shape).T}
      for k, shape in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f)))
  }


def embedding_params(m: Tree, take: Callable[..., np.ndarray]) -> Tree:
  """The embedder (``embed_tokens``, and ``lm_head`` when untied) and the
  final norm of a Llama-layout checkpoint."""
  d, v = m["d_model"], m["vocab_size"]
  tree: Tree = {
      "embedder": {"embed_0": take("embed_tokens.weight", (v, d))},
      "final_norm": {"scale": take("norm.weight", (d,))},
  }
  if not m["family_options"]["tie_embeddings"]:
    tree["embedder"]["output"] = take("lm_head.weight", (v, d))
  return tree


def llama_params(m: Tree, take: Callable[..., np.ndarray]) -> Tree:
  """The parameter tree of a Llama, Mistral, Qwen2 or Qwen3 checkpoint.

  Args:
    m: the model settings (``llama_settings``) and ``vocab_size``.
    take: ``take(name, shape)`` reads a tensor (``registry.taker``).
  """
  d = m["d_model"]
  tree = embedding_params(m, take)
  for i in range(m["num_layers"]):
    p = f"layers.{i}."
    tree[f"layer_{i}"] = {
        "attention": attention_params(m, take, p),
        "ln_attn": {"scale": take(p + "input_layernorm.weight", (d,))},
        "ln_ffn": {"scale": take(p + "post_attention_layernorm.weight", (d,))},
        "ffn": glu_params(m, take, p),
    }
  return tree
