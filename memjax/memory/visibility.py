"""Which in-batch memory entries each query may see (TRIME, Zhong et al. 2022).

A batch of B rows (segments) of T positions is flattened to N = B*T positions.
Every position is both a query and a memory entry; whether entry j is visible
to query i is decided from small per-position metadata, never from a dense
[N, N] mask, so the loss can walk over blocks of keys without materialising
N^2 booleans:

    row:  the batch row (segment) the position belongs to.
    group, stream: positions with the same `group` see each other causally on
        `stream` (strictly earlier only: a token never sees itself).

Modes (Section 4 of the paper):

    'none':     no memory at all (plain language-model loss).
    'local':    group = row, stream = position in the row. The entry is
                visible iff same row and pos_j < pos_i (Section 4.1).
    'long':     group = doc_id[row], stream = segment_index[row] * T + pos.
                Visible iff same document and earlier in the flattened
                document stream (Section 4.2). Segment indices must be
                distinct within a document.
    'external': every entry of every other row is visible; the query's own
                row is visible causally (the local memory) unless
                `hide_local` is true, which the caller draws once per step for
                the whole batch with probability p (0.9 in the paper,
                Section 4.3, Appendix H).

Positions with weight 0 (padding) are never memory entries; the loss ignores
them as queries.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array

MODES = ("none", "local", "long", "external")


@flax.struct.dataclass
class MemorySpec:
  """How the in-batch memory of one training batch is built.

  Attributes:
      mode: one of 'none', 'local', 'long', 'external' (static: changing it
          recompiles).
      doc_id: [B] int32, the document each row belongs to ('long' only).
      segment_index: [B] int32, the row's order inside its document ('long'
          only; distinct within a document).
      hide_local: scalar bool ('external' only): hide every query's own row
          (the local memory) for this step. Drawn by the caller, see
          `draw_hide_local`. A traced value, so flipping it does not recompile.
  """

  mode: str = flax.struct.field(pytree_node=False, default="local")
  doc_id: Array | None = None
  segment_index: Array | None = None
  hide_local: Array | bool = False

  @classmethod
  def none(cls) -> "MemorySpec":
    """No memory: the loss is the plain cross-entropy."""
    return cls(mode="none")

  @classmethod
  def local(cls) -> "MemorySpec":
    """Local memory: earlier tokens of the same segment."""
    return cls(mode="local")

  @classmethod
  def long(cls, doc_id: Any, segment_index: Any) -> "MemorySpec":
    """Long-term memory over consecutive segments of one document.

    Args:
        doc_id: [B] int, the document of each row.
        segment_index: [B] int, each row's position in its document's stream.

    Returns:
        The spec.
    """
    return cls(
        mode="long",
        doc_id=jnp.asarray(doc_id, jnp.int32),
        segment_index=jnp.asarray(segment_index, jnp.int32),
    )

  @classmethod
  def external(cls, hide_local: Any = False) -> "MemorySpec":
    """All other segments of the batch, plus (unless hidden) the local memory.

    Args:
        hide_local: scalar bool, hide the local memory for the whole batch.

    Returns:
        The spec.
    """
    return cls(mode="external", hide_local=jnp.asarray(hide_local, jnp.bool_))


def draw_hide_local(rng: Array, p: float = 0.9) -> Array:
  """Draws the per-step Bernoulli(p) switch that hides the local memory.

  Args:
      rng: a PRNG key.
      p: probability of hiding the local memory (0.9 in the paper).

  Returns:
      Scalar bool array.
  """
  return jax.random.bernoulli(rng, p)


@flax.struct.dataclass
class PositionMeta:
  """Per-position metadata of N flattened positions (all [N] int32)."""

  row: Array
  group: Array
  stream: Array


def position_meta(spec: MemorySpec, batch: int, length: int) -> PositionMeta:
  """Builds the per-position metadata for a [B, T] batch.

  Args:
      spec: the memory spec.
      batch: B.
      length: T.

  Returns:
      PositionMeta with [B*T] int32 fields, row-major over (B, T).
  """
  if spec.mode not in MODES:
    raise ValueError(
        f"Unknown memory mode {spec.mode!r}; expected one of {MODES}."
    )
  row = jnp.repeat(jnp.arange(batch, dtype=jnp.int32), length)
  pos = jnp.tile(jnp.arange(length, dtype=jnp.int32), batch)
  if spec.mode == "long":
    if spec.doc_id is None or spec.segment_index is None:
      raise ValueError(
          "mode 'long' needs doc_id and segment_index, both of shape [B]."
      )
    doc_id = jnp.asarray(spec.doc_id, jnp.int32)
    seg = jnp.asarray(spec.segment_index, jnp.int32)
    if doc_id.shape != (batch,) or seg.shape != (batch,):
      raise ValueError(
          f"doc_id and segment_index must have shape [B]=({batch},); got "
          f"{doc_id.shape} and {seg.shape}."
      )
    group = jnp.repeat(doc_id, length)
    stream = jnp.repeat(seg, length) * length + pos
  else:
    group = row
    stream = pos
  return PositionMeta(row=row, group=group, stream=stream)


def visible(spec: MemorySpec, q: PositionMeta, k: PositionMeta) -> Array:
  """Whether each key is visible to each query (validity not included).

  Args:
      spec: the memory spec.
      q: metadata of a block of Q queries ([Q] fields).
      k: metadata of a block of K keys ([K] fields).

  Returns:
      [Q, K] bool.
  """
  causal = (q.group[:, None] == k.group[None, :]) & (
      k.stream[None, :] < q.stream[:, None]
  )
  if spec.mode in ("local", "long"):
    return causal
  if spec.mode == "external":
    other_row = q.row[:, None] != k.row[None, :]
    show_local = jnp.logical_not(jnp.asarray(spec.hide_local, jnp.bool_))
    return other_row | (causal & show_local)
  if spec.mode == "none":
    return jnp.zeros((q.row.shape[0], k.row.shape[0]), jnp.bool_)
  raise ValueError(
      f"Unknown memory mode {spec.mode!r}; expected one of {MODES}."
  )
