"""Lazy (sparse) Adam: only the rows a step read change, moments included.

Registered as the optimiser transform ``lazy_adam``
(declared by the method as 'lazy_adam') for parameter groups of lookup
tables, such as the product-key memory values::

  c.optim.groups.memory = ml_collections.ConfigDict({
      "params": "/memory/values$", "transform": "lazy_adam",
      "learning_rate": 1e-3, "schedule": "constant", "warmup_steps": 0})

It follows PyTorch's ``SparseAdam``: a row whose gradient is all zero (a
row no lookup read; a read row whose gradient is exactly zero is
indistinguishable and left alone too) keeps its value, its first and its
second moment bit for bit; the rows read get Adam's update with one global
step count t for the bias corrections,
``p -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``.

optax has lazy Adam for none of its optimisers, hence this transform. JAX's
gradient of a gather is a dense [rows, d] scatter-add, and optax's
interface returns a dense update, so three dense passes remain: the
gradient, the test of which rows are non-zero, and ``apply_updates``. The
moments are updated by one masked dense pass (``jnp.where`` on the rows
read), which costs about what optax's Adam costs. Given a static bound on
the rows a step reads (``max_rows_read``, below the table's rows), it
gathers only those rows (``jnp.nonzero`` with that ``size``: exact, since
no more can be read), updates their moments and scatters them back, which
under a donated jitted step is in place. The choice is made when the step
is traced, never inside it: a ``lax.cond`` between the two paths made every
step pay for both (1.4x optax Adam's time at 86% of rows read, against
1.06x for the masked pass alone; docs/pkm.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from memjax import settings as settings_lib

Array = jax.Array


class LazyAdamState(NamedTuple):
  """count: [] int32 global step; mu, nu: the moments, shaped as params."""

  count: Array
  mu: Any
  nu: Any


def _row_mask(g: Array) -> Array:
  """[rows] bool: the rows of ``g`` with a non-zero entry.

  The largest magnitude of a row, not ``any(g != 0)``: XLA:CPU reduces
  floats several times faster than booleans (the whole update at BERT-base
  size: 1.01x optax Adam's time against 1.12x). The same rows: a NaN
  carries through the max, so a row holding one counts as read, as with
  ``any``; -0.0 counts as zero in both.
  """
  if g.ndim == 0:
    return g != 0
  return jnp.max(jnp.abs(g.reshape(g.shape[0], -1)), axis=1) != 0


def _bcast(mask: Array, ndim: int) -> Array:
  return mask.reshape((-1,) + (1,) * (ndim - 1)) if ndim else mask


def _dense(g, m, v, mask, b1, b2, step, eps):
  """(update, m, v) by masked dense passes over all rows."""
  keep = _bcast(mask, g.ndim)
  m_new = jnp.where(keep, b1 * m + (1 - b1) * g, m)
  v_new = jnp.where(keep, b2 * v + (1 - b2) * g * g, v)
  u = jnp.where(keep, -step * m_new / (jnp.sqrt(v_new) + eps), 0)
  return u.astype(g.dtype), m_new, v_new


def _sparse(g, m, v, mask, b1, b2, step, eps, size):
  """(update, m, v) touching only the rows read, at most ``size`` of them
  (a bound that must hold: rows past it would be left out)."""
  (idx,) = jnp.nonzero(mask, size=size, fill_value=g.shape[0])
  gr = g.at[idx].get(mode="fill", fill_value=0)
  mr = b1 * m.at[idx].get(mode="fill", fill_value=0) + (1 - b1) * gr
  vr = b2 * v.at[idx].get(mode="fill", fill_value=0) + (1 - b2) * gr * gr
  ur = (-step * mr / (jnp.sqrt(vr) + eps)).astype(g.dtype)
  # Out-of-range fill indices are dropped by the scatters.
  return (
      jnp.zeros_like(g).at[idx].set(ur, mode="drop"),
      m.at[idx].set(mr, mode="drop"),
      v.at[idx].set(vr, mode="drop"),
  )


def lazy_adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    max_rows_read: int = 0,
) -> optax.GradientTransformation:
  """PyTorch's SparseAdam as an optax transformation (see the module doc).

  Args:
    learning_rate: a float or a schedule of the step count.
    b1, b2, eps: Adam's constants.
    max_rows_read: a bound on the rows of a parameter one step can read
      (e.g. tokens x heads x k of a product-key memory); where it is below
      the parameter's rows, the gather/scatter moment update of that many
      rows. 0: no bound known, the masked dense update.
  """

  def init(params):
    zeros = lambda p: jnp.zeros_like(p)  # pylint: disable=unnecessary-lambda-assignment
    return LazyAdamState(
        jnp.zeros([], jnp.int32),
        jax.tree.map(zeros, params),
        jax.tree.map(zeros, params),
    )

  def update(grads, state, params=None):
    del params
    count = state.count + 1
    t = count.astype(jnp.float32)
    lr = (
        learning_rate(state.count) if callable(learning_rate) else learning_rate
    )
    step = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)

    def one(g, m, v):
      mask = _row_mask(g)
      if g.ndim and 0 < max_rows_read < g.shape[0]:
        return _sparse(g, m, v, mask, b1, b2, step, eps, max_rows_read)
      return _dense(g, m, v, mask, b1, b2, step, eps)

    out = jax.tree.map(one, grads, state.mu, state.nu)
    is_triple = lambda x: isinstance(x, tuple) and len(x) == 3  # pylint: disable=unnecessary-lambda-assignment
    pick = lambda i: jax.tree.map(lambda x: x[i], out, is_leaf=is_triple)  # pylint: disable=unnecessary-lambda-assignment
    return pick(0), LazyAdamState(count, pick(1), pick(2))

  return optax.GradientTransformation(init, update)


def lazy_adam_of(
    optim: settings_lib.Optim, sched: optax.Schedule
) -> optax.GradientTransformation:
  """``lazy_adam`` with the group's schedule, b1, b2 and eps."""
  return lazy_adam(
      sched, b1=float(optim.b1), b2=float(optim.b2), eps=float(optim.eps)
  )
