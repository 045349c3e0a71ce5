"""CausalSelfAttention (the vanilla LM's attention) against NumPy."""

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.models import attention
from memjax.models import block_stack
from tests.models import helpers

B, T, D, H, DH = 2, 7, 16, 2, 8


def make_layer(dtype: Any = jnp.float32) -> attention.CausalSelfAttention:
  return attention.CausalSelfAttention(
      d_model=D, num_heads=H, head_dim=DH, dtype=dtype
  )


def inputs(seed: int, shape: tuple[int, ...] = (B, T, D)) -> np.ndarray:
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def numpy_attention(params: dict, x: np.ndarray) -> np.ndarray:
  """Causal softmax attention in float64 from the layer's parameters.

  Args:
    params: {'query', 'key', 'value': [D, H, dh], 'out': [H, dh, D]}.
    x: [B, T, D].

  Returns:
    [B, T, D].
  """
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  x = np.asarray(x, np.float64)
  q = np.einsum("btd,dhk->bhtk", x, p["query"])
  k = np.einsum("btd,dhk->bhtk", x, p["key"])
  v = np.einsum("btd,dhk->bhtk", x, p["value"])
  seq = x.shape[1]
  out = np.zeros((x.shape[0], seq, x.shape[2]))
  for b in range(x.shape[0]):
    for h in range(p["query"].shape[1]):
      for i in range(seq):
        scores = k[b, h, : i + 1] @ q[b, h, i] / np.sqrt(q.shape[-1])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        context = probs @ v[b, h, : i + 1]  # [dh]
        out[b, i] += context @ p["out"][h]
  return out


@pytest.fixture(scope="module")
def layer_and_apply() -> tuple[dict, Callable]:
  layer = make_layer()
  x = jnp.asarray(inputs(0))
  params = jax.jit(lambda key: layer.init(key, x))(jax.random.key(0))["params"]
  apply = jax.jit(lambda p, x: layer.apply({"params": p}, x))
  return flax.core.meta.unbox(params), apply


def test_parameters_have_the_documented_shapes_and_axes() -> None:
  layer = make_layer()
  boxed = jax.eval_shape(
      lambda: layer.init(jax.random.key(0), jnp.zeros((B, T, D)))
  )["params"]
  qkv = ("embed", "heads", "kv")
  spec = flax.linen.get_partition_spec(boxed)
  assert {k: tuple(v) for k, v in spec.items()} == {
      "query": qkv,
      "key": qkv,
      "value": qkv,
      "out": ("heads", "kv", "embed"),
  }
  assert jax.tree_util.tree_map(
      lambda a: a.shape, flax.core.meta.unbox(boxed)
  ) == {
      "query": (D, H, DH),
      "key": (D, H, DH),
      "value": (D, H, DH),
      "out": (H, DH, D),
  }


def test_output_matches_numpy_causal_attention(
    layer_and_apply: tuple[dict, Callable],
) -> None:
  params, apply = layer_and_apply
  x = inputs(1)
  y, memory = apply(params, x)
  assert memory is None
  assert y.shape == (B, T, D) and y.dtype == jnp.float32
  np.testing.assert_allclose(
      np.asarray(y), numpy_attention(params, x), rtol=1e-5, atol=1e-5
  )


def test_future_tokens_do_not_change_past_outputs(
    layer_and_apply: tuple[dict, Callable],
) -> None:
  params, apply = layer_and_apply
  x = inputs(2)
  y = np.asarray(apply(params, x)[0])
  noise = inputs(3)
  for t in [0, 1, T // 2, T - 1]:
    changed = x.copy()
    changed[:, t:] += noise[:, t:]
    y2 = np.asarray(apply(params, changed)[0])
    np.testing.assert_array_equal(y2[:, :t], y[:, :t])
    assert np.abs(y2[:, t] - y[:, t]).max() > 1e-3


def test_bfloat16_compute_is_close_to_float32(
    layer_and_apply: tuple[dict, Callable],
) -> None:
  params, apply = layer_and_apply
  x = inputs(4)
  layer = make_layer(jnp.bfloat16)
  y16, _ = jax.jit(lambda p, x: layer.apply({"params": p}, x))(params, x)
  assert y16.dtype == jnp.bfloat16
  np.testing.assert_allclose(
      np.asarray(y16, np.float32),
      np.asarray(apply(params, x)[0]),
      rtol=0,
      atol=0.05,
  )


def test_post_layer_norm_block_matches_numpy():
  """Post-LN: h = LN1(x + Attn(x)); out = LN2(h + FFN(h)); g = h; the
  model has no final LayerNorm. Pre-LN keeps its final LayerNorm."""
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax.models import transformer  # pylint: disable=g-import-not-at-top

  kw = dict(num_layers=1, d_model=16, num_heads=2, head_dim=8, d_ff=32)
  post = transformer.TransformerLM(
      cfg=helpers.config(30, **kw, norm_position="post", norm_epsilon=1e-5)
  )
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 30, (2, 5)))
  params = flax.linen.meta.unbox(
      post.init(jax.random.PRNGKey(0), tokens, tokens)["params"]
  )
  assert "final_norm" not in params
  pre = transformer.TransformerLM(cfg=helpers.config(30, **kw))
  assert "final_norm" in pre.init(jax.random.PRNGKey(0), tokens)["params"]
  block = params["layer_0"]

  def ln(x, p, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]

  vanilla = build.parts().attention.get("vanilla")

  def attn(x):
    return np.asarray(
        vanilla(d_model=16, num_heads=2, head_dim=8).apply(
            {"params": block["attention"]}, jnp.asarray(x), None
        )[0]
    )

  def ffn(x):
    f = block["ffn"]
    h = np.maximum(x @ f["wi"]["kernel"] + f["wi"]["bias"], 0)
    return h @ f["wo"]["kernel"] + f["wo"]["bias"]

  x = (
      np.asarray(
          post.apply(
              {"params": params},
              tokens,
              method=lambda m, t: m.embedder.embed(t),
          )
      )
      + block_stack.sinusoid_table(5, 16)[None]
  )
  h = ln(x + attn(x), block["ln_attn"])
  want = ln(h + ffn(h), block["ln_ffn"])
  out = post.apply({"params": params}, tokens, tokens)
  np.testing.assert_allclose(np.asarray(out.hidden), want, rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(np.asarray(out.features), h, rtol=2e-4, atol=2e-4)


def test_final_layer_norm_switch_and_activation_dropout():
  from memjax.models import feed_forward  # pylint: disable=g-import-not-at-top
  from memjax.models import transformer  # pylint: disable=g-import-not-at-top

  tokens = jnp.zeros((1, 4), jnp.int32)
  lm = transformer.TransformerLM(
      cfg=helpers.config(
          20,
          num_layers=1,
          d_model=8,
          num_heads=2,
          head_dim=4,
          d_ff=16,
          final_layer_norm=False,
      )
  )
  assert "final_norm" not in lm.init(jax.random.PRNGKey(0), tokens)["params"]
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
  options = feed_forward.FeedForwardOptions
  off = feed_forward.FeedForward(8, 16, dropout_rate=0.5, options=options(0.0))
  on = feed_forward.FeedForward(8, 16, dropout_rate=0.0, options=options(0.5))
  params = off.init(jax.random.PRNGKey(2), x, deterministic=True)
  rngs = {"dropout": jax.random.PRNGKey(3)}
  plain = off.apply(params, x, deterministic=True)
  # Only the activation dropout acts inside the block (the residual dropout
  # is the decoder block's).
  np.testing.assert_allclose(
      off.apply(params, x, deterministic=False, rngs=rngs), plain, rtol=1e-6
  )
  assert not np.allclose(
      on.apply(params, x, deterministic=False, rngs=rngs), plain
  )
