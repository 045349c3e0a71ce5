"""``benchmarks/plan_formula.py``'s count of matrix products in HLO text, on
programs whose products are counted by hand."""

import jax
import jax.numpy as jnp

from benchmarks import plan_formula


def _hlo(fn, *args) -> str:
  return jax.jit(fn).lower(*args).as_text(dialect="hlo")


def test_products_counted_once_per_call():
  x, w = jnp.ones((4, 8)), jnp.ones((8, 8))
  inner = jax.jit(lambda x, w: x @ w)  # a computation of its own, called
  hlo = _hlo(lambda x, w: inner(inner(x, w), w) @ w.T, x, w)
  assert " call(" in hlo
  # Three [4, 8] x [8, 8] products, 2 x 4 x 8 x 8 FLOPs each.
  assert plan_formula.matmul_flops(hlo) == 3 * 2 * 4 * 8 * 8
  # XLA's own count of this program, which has nothing but products.
  assert (
      plan_formula.matmul_flops(hlo)
      == jax.jit(lambda x, w: inner(inner(x, w), w) @ w.T)
      .lower(x, w)
      .cost_analysis()["flops"]
  )


def test_batched_contractions():
  q, k = jnp.ones((2, 3, 5, 16)), jnp.ones((2, 7, 5, 16))
  hlo = _hlo(lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k), q, k)
  # Per batch and head a [3, 16] x [16, 7] product.
  assert plan_formula.matmul_flops(hlo) == 2 * 5 * 2 * 3 * 16 * 7
