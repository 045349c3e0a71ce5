"""LaMemo: look-ahead memory attention (Ji et al. 2022).

One ``LaMemoAttention`` layer does two things per segment:

1. Causal relative attention of the current tokens over
   ``concat(memory, segment)``, as Transformer-XL. Its outputs C-> (before
   the output projection) and their log-normalisers join the memory.
2. Look-ahead refresh of the memory (Eq. 7-11): every memory token attends
   to the positions on its right within a window of the newest positions
   (Eq. 7-9), and the result C<- is interpolated with the memory's old
   vector C_old (Eq. 10-11) by their softmax normalisers.

The look-ahead window (Eq. 7) is the last W - 1 memory tokens and the first
current token, W = min(M, T): memory token i reads window positions p > i
(softmax_nabla of Eq. 9), never past the first token of the current segment.
The first current token can be read because every current query may read it,
so no prediction sees a token it should not. Successive windows tile the
stream (segment s ends its window at position sT, segment s + 1 starts at
sT + 1), so after each refresh a memory token has attended to every position
after it up to the current segment's first token, exactly once.

Interpolation, in log space and float32 (Eq. 10-11, the authors' code):

    m      = max(d_old, d_new)
    alpha  = exp(d_old - m) / (exp(d_old - m) + exp(d_new - m) + eps)
    C      = alpha * C_old + (1 - alpha) * C_new
    d      = logaddexp(d_old, d_new)

where d_old, d_new are the log-normalisers (logsumexp of the scaled, masked
scores) of C_old and C_new. Note that eps is added after subtracting m, as in
the authors' code; it equals Eq. 11's epsilon scaled by exp(-m).

How the refreshed memory reaches the next layer. As in the authors' code the
memory tokens' hidden states are recomputed in every segment: a LaMemo stack
keeps the M previous layer-0 inputs, prepends them to the segment, and runs
the whole [B, M + T, D] sequence through the blocks. This layer therefore
takes its input as ``x = concat(memory rows, segment) : [B, M + T, D]`` and
returns outputs for all M + T rows: the memory rows get the output projection
of the refreshed vectors, the segment rows that of their causal attention.
The block's residual and feed-forward apply to all rows alike, and the memory
rows entering layer l + 1 are the refreshed states. Only the vectors C and
their log-normalisers are carried per layer (``LaMemoMemory``, float32). See
docs/lamemo.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from memjax.models import variables as model_vars
from memjax.models import attention as attention_lib
from memjax.models import recurrence
from memjax.methods.recurrent import segment_memory as rmemory
from memjax.methods.recurrent import relative


def interpolate_memory(
    c_old: jax.Array,
    lse_old: jax.Array,
    c_new: jax.Array,
    lse_new: jax.Array,
    eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Memory interpolation (Eq. 10-11) in log space.

  Args:
      c_old: [..., H, dh] float32 old memory vectors C_old (stop-gradient).
      lse_old: [..., H] float32 their log-normalisers; -inf for "no old
          vector" (alpha becomes 0).
      c_new: [..., H, dh] float32 look-ahead vectors C<-.
      lse_new: [..., H] float32 their log-normalisers.
      eps: added to the denominator after subtracting max(lse_old, lse_new).

  Returns:
      (c [..., H, dh] float32 interpolated vectors,
       lse [..., H] float32 logaddexp(lse_old, lse_new),
       alpha [..., H] float32 weight of the old vectors).
  """
  lse_old = lse_old.astype(jnp.float32)
  lse_new = lse_new.astype(jnp.float32)
  top = jnp.maximum(lse_old, lse_new)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  s_old = jnp.exp(lse_old - top)
  s_new = jnp.exp(lse_new - top)
  alpha = s_old / (s_old + s_new + eps)
  c = alpha[..., None] * c_old.astype(jnp.float32) + (
      1.0 - alpha[..., None]
  ) * c_new.astype(jnp.float32)
  return c, jnp.logaddexp(lse_old, lse_new), alpha


def look_ahead_window(mem_len: int, seg_len: int) -> tuple[int, int]:
  """Rows of ``concat(memory, segment)`` that are look-ahead keys (Eq. 7).

  Args:
      mem_len: M > 0.
      seg_len: T > 0.

  Returns:
      (start, width): keys are rows start .. start + width - 1 = M, i.e. the
      last width - 1 memory rows and the first segment row,
      width = min(M, T).
  """
  width = min(mem_len, seg_len)
  return mem_len - width + 1, width


@dataclasses.dataclass(frozen=True)
class LaMemoOptions:
  """``model.attention_options`` of the 'lamemo' kind.

  Attributes:
    position: 'disentangled' (Eq. 12, the paper's choice) or 'xl' (Eq. 6
      for both directions; the look-ahead then uses R of negative
      distances with the same v).
    look_ahead: refresh the memory with look-ahead attention. False keeps
      the memory vectors as they were computed (Transformer-XL behaviour).
    interpolate: interpolate old and look-ahead vectors (Eq. 10-11). False
      means alpha = 0: the refreshed memory is the new look-ahead attention
      only (and its log-normaliser that of the window).
    eps: epsilon of Eq. 11 (added after the max subtraction).
  """

  position: str = "disentangled"
  look_ahead: bool = True
  interpolate: bool = True
  eps: float = 1e-6


class LaMemoAttention(relative.RelativeAttentionBase):
  """Look-ahead memory attention layer (LaMemo Eq. 6-12).

  Registered as the 'lamemo' attention kind. A stack of these layers with
  ``mem_len > 0`` carries ``(inputs, layers)``: an ``XLMemory`` of the last
  M layer-0 inputs and one ``LaMemoMemory`` per layer; the M memory rows
  are prepended to the segment and run through every block with it
  ([B, M + T, D]), and only the T segment rows leave the stack (see the
  module docstring and docs/lamemo.md).

  Attributes (besides those of ``RelativeAttentionBase``):
      options: the kind's switches (``LaMemoOptions``).

  Parameters: those of ``XLAttention`` for position='xl' (query, key,
  value, pos_key, out, u, v) and of ``DisentangledAttention`` for
  'disentangled' (u, v_plus, v_minus). The look-ahead shares every
  projection and bias with the causal attention.
  """

  options: LaMemoOptions = LaMemoOptions()

  RECURRENT: ClassVar[bool] = True

  def position_scheme(self) -> str:
    return self.options.position

  @classmethod
  def decodes_cached(cls, mem_len: int) -> bool:
    """With a memory by ``lamemo_decoding.LaMemoDecoder``, without one as
    a relative kind (``decode_step``)."""
    del mem_len
    return True

  @classmethod
  def cached_decoder(cls, mem_len: int) -> Any:
    """``lamemo_decoding.LaMemoDecoder`` for a model with a memory."""
    if not cls.carries_memory(mem_len):
      return None
    from memjax.methods.recurrent import lamemo_decoding  # pylint: disable=g-import-not-at-top

    return lamemo_decoding.LaMemoDecoder

  @classmethod
  def init_layer_memory(
      cls, batch_size: int, dims: attention_lib.StackDims
  ) -> rmemory.LaMemoMemory:
    """One layer's empty memory (float32 c and lse, all invalid)."""
    return rmemory.init_lamemo_memory(
        batch_size, dims.mem_len, dims.num_heads, dims.head_dim
    )

  @classmethod
  def init_stack_memory(
      cls, batch_size: int, dims: attention_lib.StackDims
  ) -> Any:
    """(``XLMemory`` of the layer-0 inputs, x [B, M, D] compute dtype; a
    tuple of ``num_layers`` ``LaMemoMemory`` with float32 c [B, M, H, dh]
    and lse [B, M, H]), or None without memory."""
    if not cls.carries_memory(dims.mem_len):
      return None
    inputs = rmemory.init_xl_memory(
        batch_size, dims.mem_len, dims.d_model, dims.dtype
    )
    layers = tuple(
        cls.init_layer_memory(batch_size, dims) for _ in range(dims.num_layers)
    )
    return inputs, layers

  @classmethod
  def enter_stack(
      cls, x: jax.Array, memory: Any
  ) -> tuple[jax.Array, Sequence[Any]]:
    """concat(stored layer-0 inputs of the last M tokens, segment)
    [B, M + T, D]; every block refreshes the memory rows (look-ahead) and
    the next block reads them."""
    inputs, layers = memory
    rows = jax.lax.stop_gradient(inputs.x).astype(x.dtype)
    return jnp.concatenate([rows, x], axis=1), layers

  @classmethod
  def leave_stack(
      cls,
      x: jax.Array,
      h: jax.Array,
      g: jax.Array,
      layer_memories: Sequence[Any],
      memory: Any,
      mem_len: int,
  ) -> tuple[jax.Array, jax.Array, Any]:
    """The T segment rows of h and g, and (the layer-0 inputs with the
    segment pushed, the layers' new memories)."""
    inputs, _ = memory
    rows = inputs.x.shape[1]
    new_inputs = rmemory.push_xl_memory(inputs, x, mem_len or rows)
    return h[:, rows:], g[:, rows:], (new_inputs, tuple(layer_memories))

  def init_memory(
      self, batch_size: int, mem_len: int | None = None
  ) -> rmemory.LaMemoMemory:
    """Empty memory for this layer (float32 c and lse, all invalid)."""
    return rmemory.init_lamemo_memory(
        batch_size,
        self.mem_len if mem_len is None else mem_len,
        self.num_heads,
        self.head_dim,
    )

  def __call__(
      self,
      x: jax.Array,
      memory: rmemory.LaMemoMemory | None,
      *,
      deterministic: bool,
      mask: jax.Array | None = None,
      pos: jax.Array | None = None,
      positions: jax.Array | None = None,
  ) -> tuple[jax.Array, rmemory.LaMemoMemory | None]:
    """Causal attention of the segment and look-ahead refresh of memory.

    Args:
        x: layer input after the pre-LayerNorm. With memory:
            [B, M + T, D], the M memory rows (this segment's states of
            the memory tokens at this layer) followed by the T segment
            rows. Without memory: [B, T, D].
        memory: ``LaMemoMemory`` with M slots, or None (no memory:
            Transformer+RPE behaviour).
        deterministic: disables attention dropout.
        mask, pos: cached decoding's (``decode_step``); with ``pos``,
            ``memory`` is this layer's (keys, values) cache.
        positions: ignored (the relative terms read slot distances).

    Returns:
        (y: same shape as x, compute dtype, after the output projection;
            rows [:M] are the refreshed memory outputs W_o C<->, rows
            [M:] the segment outputs W_o C->;
         new memory: ``LaMemoMemory`` with the last ``mem_len`` (or M)
            rows of concat(refreshed memory, segment), stop-gradient;
            None if memory is None).

    Sows (collection 'intermediates', only when it is mutable):
        attention_probs: [B, H, T, M + T] float32 causal probabilities.
        look_ahead_probs: [B, H, M, W] float32 (when refreshing).
        alpha: [B, M, H] float32 interpolation weights of the old memory
            (when refreshing; 0 on invalid slots).

    Reports (collection 'aux', ``memjax.models.variables``): ``alpha``, the mean
    interpolation weight over valid memory slots and heads (when
    refreshing).
    """
    del positions
    if isinstance(memory, rmemory.LaMemoCache):
      from memjax.methods.recurrent import lamemo_decoding  # pylint: disable=g-import-not-at-top

      return lamemo_decoding.cached_attention(self, x, memory, pos)
    if pos is not None:
      return self.decode_step(x, memory, pos, mask)
    x = nn.with_logical_constraint(
        x.astype(self.dtype), ("batch", "length", "embed")
    )
    q, k, v, c_seg, lse_seg, seg_len = self.segment_attention(
        x, memory, deterministic
    )
    if memory is None:
      return self._project(c_seg), None
    return self._with_memory(
        q, k, v, memory, c_seg, lse_seg, seg_len, deterministic
    )

  def segment_attention(
      self,
      x: jax.Array,
      memory: rmemory.LaMemoMemory | None,
      deterministic: bool,
  ) -> tuple[jax.Array, ...]:
    """Causal attention of the T segment rows over all M + T rows.

    Returns:
      (q, k, v [B, M + T, H, dh], c_seg [B, T, H, dh] and lse_seg [B, T, H]
      of the segment rows, T).
    """
    batch, total, _ = x.shape
    if memory is None:
      mem_len = 0
      mem_valid = jnp.zeros((batch, 0), jnp.bool_)
    else:
      mem_len = memory.c.shape[1]
      mem_valid = memory.valid
    seg_len = total - mem_len
    if seg_len < 1:
      raise ValueError(
          f"LaMemoAttention expects x = concat(memory rows, segment) "
          f"with {mem_len} memory rows and at least one segment row; got "
          f"x of length {total}"
      )
    axes = ("batch", "length", "heads", "kv")
    q = nn.with_logical_constraint(self.core.project(x, "query"), axes)
    k = nn.with_logical_constraint(self.core.project(x, "key"), axes)
    v = nn.with_logical_constraint(self.core.project(x, "value"), axes)
    scores = self.core.scores(
        q[:, mem_len:], k, delta_top=total - 1, past_only=True
    )
    key_valid = jnp.concatenate(
        [mem_valid, jnp.ones((batch, seg_len), jnp.bool_)], axis=1
    )
    query_pos = mem_len + jnp.arange(seg_len)
    causal = jnp.arange(total)[None, :] <= query_pos[:, None]
    c_seg, lse_seg, probs = self.core.attend(
        scores, key_valid[:, None, None, :] & causal, v, deterministic
    )
    self.sow("intermediates", "attention_probs", probs)
    return q, k, v, c_seg, lse_seg, seg_len

  def _with_memory(
      self,
      q: jax.Array,
      k: jax.Array,
      v: jax.Array,
      memory: rmemory.LaMemoMemory,
      c_seg: jax.Array,
      lse_seg: jax.Array,
      seg_len: int,
      deterministic: bool,
  ) -> tuple[jax.Array, rmemory.LaMemoMemory]:
    """Refreshes the memory rows and pushes the segment.

    Args:
        q, k, v: [B, M + T, H, dh] projections of memory rows and segment.
        memory: the layer's ``LaMemoMemory`` with M slots.
        c_seg: [B, T, H, dh] float32 segment contexts; lse_seg [B, T, H].
        seg_len: T.
        deterministic: disables attention dropout.

    Returns:
        (y [B, M + T, D] after the output projection, the new memory).
    """
    mem_len, mem_valid = memory.c.shape[1], memory.valid
    batch = q.shape[0]
    c_mem, lse_mem = self.refreshed_memory(
        q, k, v, memory, seg_len, deterministic
    )
    y = self._project(jnp.concatenate([c_mem, c_seg], axis=1))

    new_len = self.mem_len if self.mem_len > 0 else mem_len
    seg_valid = jnp.ones((batch, seg_len), jnp.bool_)
    new_memory = rmemory.LaMemoMemory(
        c=recurrence.fifo_append(c_mem, c_seg, new_len),
        lse=recurrence.fifo_append(lse_mem, lse_seg, new_len),
        valid=recurrence.fifo_append(mem_valid, seg_valid, new_len),
    )
    return y, jax.lax.stop_gradient(new_memory)

  def refreshed_memory(
      self,
      q: jax.Array,
      k: jax.Array,
      v: jax.Array,
      memory: rmemory.LaMemoMemory,
      seg_len: int,
      deterministic: bool,
  ) -> tuple[jax.Array, jax.Array]:
    """The memory rows refreshed by look-ahead (zero on invalid slots).

    Args:
        q, k, v: [B, M + R, H, dh] projections of the memory rows and R >= 1
            segment rows (the look-ahead reads the first).
        memory: the layer's ``LaMemoMemory`` with M slots.
        seg_len: T, the segment length (the look-ahead window's width is
            min(M, T)).
        deterministic: disables attention dropout.

    Returns:
        (c [B, M, H, dh] float32, lse [B, M, H] float32).
    """
    mem_len, mem_valid = memory.c.shape[1], memory.valid
    c_old = jax.lax.stop_gradient(memory.c).astype(jnp.float32)
    lse_old = jax.lax.stop_gradient(memory.lse).astype(jnp.float32)
    if self.options.look_ahead and mem_len > 0:
      c_mem, lse_mem = self._refresh(
          q, k, v, mem_valid, c_old, lse_old, seg_len, deterministic
      )
    else:
      c_mem, lse_mem = c_old, lse_old
    c_mem = jnp.where(mem_valid[:, :, None, None], c_mem, 0.0)
    lse_mem = jnp.where(mem_valid[:, :, None], lse_mem, 0.0)
    c_mem = nn.with_logical_constraint(c_mem, ("batch", "mem", "heads", "kv"))
    lse_mem = nn.with_logical_constraint(lse_mem, ("batch", "mem", "heads"))
    return c_mem, lse_mem

  def _refresh(
      self,
      q: jax.Array,
      k: jax.Array,
      v: jax.Array,
      mem_valid: jax.Array,
      c_old: jax.Array,
      lse_old: jax.Array,
      seg_len: int,
      deterministic: bool,
  ) -> tuple[jax.Array, jax.Array]:
    """Look-ahead attention (Eq. 7-9) and interpolation (Eq. 10-11).

    Args:
        q, k, v: [B, M + T, H, dh] projections of all rows.
        mem_valid: [B, M] bool.
        c_old: [B, M, H, dh] float32 memory vectors.
        lse_old: [B, M, H] float32 their log-normalisers.
        seg_len: T.
        deterministic: disables attention dropout.

    Returns:
        (c [B, M, H, dh] float32, lse [B, M, H] float32) refreshed.
    """
    mem_len = c_old.shape[1]
    start, width = look_ahead_window(mem_len, seg_len)
    keys = slice(start, start + width)
    # Memory query i (position i) and window key w (position start + w)
    # are i - start - w apart; the last query and first key: M-1-start.
    scores = self.core.scores(
        q[:, :mem_len],
        k[:, keys],
        delta_top=mem_len - 1 - start,
        past_only=False,
    )
    key_pos = start + jnp.arange(width)
    key_valid = jnp.concatenate(
        [mem_valid, jnp.ones((mem_valid.shape[0], 1), jnp.bool_)], axis=1
    )[:, start:]
    right = key_pos[None, :] > jnp.arange(mem_len)[:, None]
    c_new, lse_new, probs = self.core.attend(
        scores, key_valid[:, None, None, :] & right, v[:, keys], deterministic
    )
    self.sow("intermediates", "look_ahead_probs", probs)

    if self.options.interpolate:
      lse_old = jnp.where(mem_valid[:, :, None], lse_old, -jnp.inf)
      c, lse, alpha = interpolate_memory(
          c_old, lse_old, c_new, lse_new, self.options.eps
      )
    else:
      c, lse = c_new, lse_new
      alpha = jnp.zeros_like(lse_new)
    alpha = jnp.where(mem_valid[:, :, None], alpha, 0.0)
    self.sow("intermediates", "alpha", alpha)
    model_vars.report_mean(self, "alpha", alpha, mem_valid[:, :, None])
    return c, lse
