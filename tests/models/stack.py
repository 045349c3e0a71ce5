"""A small pre-LN stack of relative-attention blocks, for tests only.

Block: h = x + attn(LN1(x), mem); out = h + FFN(LN2(h)) (no dropout). The
Transformer-XL stack carries one ``XLMemory`` per layer. The LaMemo stack
carries ``(inputs, layers)``: an ``XLMemory`` of the previous layer-0 inputs
and one ``LaMemoMemory`` per layer; it prepends the memory rows to the
segment and runs all M + T rows through every block, as docs/lamemo.md
describes for the decoder.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax.models import lamemo
from memjax.models import recurrence
from memjax.models import relative

KINDS = ("xl", "disentangled", "lamemo")


def make_attention(kind: str, **kwargs) -> nn.Module:
  """The attention layer of a kind ('xl', 'disentangled' or 'lamemo')."""
  cls = {
      "xl": relative.XLAttention,
      "disentangled": relative.DisentangledAttention,
      "lamemo": lamemo.LaMemoAttention,
  }[kind]
  return cls(**kwargs)


class Block(nn.Module):
  """One pre-LN block around a relative attention layer."""

  kind: str
  d_model: int
  num_heads: int
  head_dim: int
  d_ff: int
  mem_len: int
  dtype: Any = jnp.float32
  attn_kwargs: tuple[tuple[str, Any], ...] = ()

  def attention(self, **kwargs) -> nn.Module:
    return make_attention(
        self.kind,
        d_model=self.d_model,
        num_heads=self.num_heads,
        head_dim=self.head_dim,
        mem_len=self.mem_len,
        dtype=self.dtype,
        **dict(self.attn_kwargs),
        **kwargs,
    )

  @nn.compact
  def __call__(self, x, memory, deterministic: bool = True):
    a, new_memory = self.attention(name="attn")(
        nn.LayerNorm(dtype=self.dtype, name="ln1")(x),
        memory,
        deterministic=deterministic,
    )
    h = x + a
    f = nn.LayerNorm(dtype=self.dtype, name="ln2")(h)
    f = nn.Dense(self.d_ff, dtype=self.dtype, name="ff1")(f)
    f = nn.Dense(self.d_model, dtype=self.dtype, name="ff2")(nn.relu(f))
    return h + f, new_memory


class Stack(nn.Module):
  """``num_layers`` blocks over continuous inputs [B, T, D]."""

  kind: str
  num_layers: int = 2
  d_model: int = 16
  num_heads: int = 2
  head_dim: int = 4
  d_ff: int = 32
  mem_len: int = 6
  dtype: Any = jnp.float32
  attn_kwargs: tuple[tuple[str, Any], ...] = ()

  def _block(self, i: int) -> Block:
    return Block(
        self.kind,
        self.d_model,
        self.num_heads,
        self.head_dim,
        self.d_ff,
        self.mem_len,
        self.dtype,
        self.attn_kwargs,
        name=f"block_{i}",
    )

  def init_memory(self, batch_size: int) -> Any:
    """All-invalid memory of the whole stack."""
    attn = make_attention(
        self.kind,
        d_model=self.d_model,
        num_heads=self.num_heads,
        head_dim=self.head_dim,
        mem_len=self.mem_len,
        dtype=self.dtype,
        parent=None,
        **dict(self.attn_kwargs),
    )
    layers = tuple(attn.init_memory(batch_size) for _ in range(self.num_layers))
    if self.kind != "lamemo":
      return layers
    inputs = recurrence.init_xl_memory(
        batch_size, self.mem_len, self.d_model, self.dtype
    )
    return inputs, layers

  @nn.compact
  def __call__(self, x, memory, deterministic: bool = True):
    """Returns (y [B, T, D], new memory or None)."""
    x = x.astype(self.dtype)
    if self.kind != "lamemo":
      h, new_layers = x, []
      for i in range(self.num_layers):
        mem_i = None if memory is None else memory[i]
        h, new_mem = self._block(i)(h, mem_i, deterministic)
        new_layers.append(new_mem)
      return h, (None if memory is None else tuple(new_layers))

    if memory is None:
      h = x
      for i in range(self.num_layers):
        h, _ = self._block(i)(h, None, deterministic)
      return h, None
    inputs, layers = memory
    mem_len = inputs.x.shape[1]
    rows = jax.lax.stop_gradient(inputs.x).astype(self.dtype)
    h = jnp.concatenate([rows, x], axis=1)
    new_layers = []
    for i in range(self.num_layers):
      h, new_mem = self._block(i)(h, layers[i], deterministic)
      new_layers.append(new_mem)
    new_inputs = recurrence.push_xl_memory(inputs, x, self.mem_len)
    return h[:, mem_len:], (new_inputs, tuple(new_layers))


def run_loop(step, segments, memory):
  """Python loop of ``step(memory, segment) -> (y, memory)`` over segments
  [S, B, T, D]; returns (ys [S, B, T, D], list of memories after each)."""
  ys, memories = [], []
  for s in range(segments.shape[0]):
    y, memory = step(memory, segments[s])
    ys.append(y)
    memories.append(memory)
  return jnp.stack(ys), memories
