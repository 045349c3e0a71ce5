"""``hlo_flops``: XLA's own count where a program has no loop to repeat,
and every iteration counted where it has: the looping program against the
same program unrolled (``memjax.models.stack.unrolled``, the switch the plan used
before it counted trip counts)."""

import jax
import jax.numpy as jnp
import pytest

from configs import trime_wt103
from memjax import build
from memjax.models import stack
from memjax.modes import hlo_flops
from memjax.modes import plan_compile


def _nested(unrolled: bool):
  """The gradient of two nested scans (3 inner steps in 5 outer ones)."""

  def f(w, x):
    def body(c, xi):
      def inner(c2, _):
        return jnp.tanh(c2 @ w) * 2.0, None

      c2, _ = jax.lax.scan(
          inner, xi + c, None, length=3, unroll=3 if unrolled else 1
      )
      y = jax.nn.relu(c2) + c
      return y, jnp.max(y)

    c, ys = jax.lax.scan(
        body, jnp.zeros((4, 16)), x, unroll=5 if unrolled else 1
    )
    return c.sum() + ys.sum()

  return jax.jit(jax.grad(f)).lower(jnp.ones((16, 16)), jnp.ones((5, 4, 16)))


def test_loops_once_is_xlas_count_and_trips_are_the_unrolled_count():
  looping, unrolled = _nested(False), _nested(True)
  counter = hlo_flops.Counter(looping.as_text(dialect="hlo"))
  # XLA's rules, each loop body once: XLA's own count, exactly, for the
  # lowering and for the compiled (fused, rewritten) program.
  assert counter.total(trips=False) == looping.cost_analysis()["flops"]
  compiled = looping.compile()
  assert hlo_flops.module_flops(compiled.as_text(), trips=False) == (
      compiled.cost_analysis()["flops"]
  )
  # The unrolled program has no loop left: XLA's count again, exactly.
  assert hlo_flops.module_flops(unrolled.as_text(dialect="hlo")) == (
      unrolled.cost_analysis()["flops"]
  )
  # Trip counts: 5 outer steps, 3 inner ones each. The looping program
  # adds only its loop counters to the unrolled one's work.
  assert sorted(hlo_flops.known_trip_counts(compiled.as_text())) == [3, 3, 5, 5]
  assert counter.total() == pytest.approx(
      unrolled.cost_analysis()["flops"], rel=0.005
  )
  assert counter.total() > 10 * counter.total(trips=False)
  assert not counter.uncounted_loops


def test_hand_counted_dot_loop():
  # 7 steps of a [2, 8] x [8, 4] product and an add of the [2, 4] result:
  # 7 * (2 * 2 * 4 * 8 + 2 * 4) FLOPs, plus the loop counter's 7 adds and
  # 7 compares.
  def f(w, x):
    return jax.lax.scan(lambda c, xi: (c + xi @ w, None), jnp.zeros((2, 4)), x)[
        0
    ]

  lowered = jax.jit(f).lower(jnp.ones((8, 4)), jnp.ones((7, 2, 8)))
  counter = hlo_flops.Counter(lowered.as_text(dialect="hlo"))
  assert counter.total() == 7 * (2 * 2 * 4 * 8 + 2 * 4) + 7 * 2


def test_smoke_step_counted_as_unrolled(tmp_path):
  # The smoke config's train step: 2 micro-batches, the adaptive softmax in
  # chunks, TRIME's memory blocks. Counted from the looping program, it
  # is XLA's count of the same step with every scan unrolled.
  c = trime_wt103.get_config("smoke")
  c.plan.devices = 8
  c.data.batch_size, c.train.grad_accum = 16, 2
  step = plan_compile.build_step(build.build(c, str(tmp_path)), jax.devices())
  flops = plan_compile.step_flops(step)
  with stack.unrolled():
    lowered = step.make_fn().lower(*step.args)
  assert flops["flops"] == pytest.approx(
      lowered.cost_analysis()["flops"], rel=0.01
  )
  unrolled_device = lowered.compile().cost_analysis()["flops"]
  assert flops["flops_per_device"] == pytest.approx(unrolled_device, rel=0.05)
  assert flops["uncounted_loops"] == 0


def test_dilated_convolution_counts_the_positions_it_reads():
  # The TPU compiler's form of a batched product [2, 4] x ([3072, 32] x
  # [32, 3072]) (from its compiled train step): batch and heads on spatial
  # dimensions dilated 2x4, so of the 2x4 window only one position per
  # output reads an element. 2 x output x 32 contracted, not 8 times that.
  text = """HloModule m

ENTRY %main (a: f32[2,4,32,3072], b: f32[2,3072,4,32]) -> f32[2,4,3072,3072] {
  %a = f32[2,4,32,3072]{3,2,1,0} parameter(0)
  %b = f32[2,3072,4,32]{3,2,1,0} parameter(1)
  ROOT %c = f32[2,4,3072,3072]{3,2,1,0} convolution(%a, %b), window={size=2x4 stride=1x3 lhs_dilate=2x4}, dim_labels=01fb_0o1i->01bf
}
"""
  assert hlo_flops.module_flops(text) == 2 * (2 * 4 * 3072 * 3072) * 32
  # An undilated convolution: every window position reads (3 of a 3-wide
  # window at 8 output positions of a padded 8-long input: 22 pairs).
  text = """HloModule m

ENTRY %main (a: f32[1,8,5], b: f32[3,5,7]) -> f32[1,8,7] {
  %a = f32[1,8,5]{2,1,0} parameter(0)
  %b = f32[3,5,7]{2,1,0} parameter(1)
  ROOT %c = f32[1,8,7]{2,1,0} convolution(%a, %b), window={size=3 pad=1_1}, dim_labels=b0f_0io->b0f
}
"""
  assert hlo_flops.module_flops(text) == 2 * 7 * 5 * 22


def test_reduce_window_over_a_whole_row_is_that_reduction():
  # The TPU compiler's form of a row maximum broadcast back over the row
  # (a softmax's): a window of 2n - 1 padded n - 1 each side. One
  # application per input element, not n per output element; a window
  # shorter than its dimension keeps XLA's (window - 1) per output.
  text = """HloModule m

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

ENTRY %main (x: f32[4,3072]) -> (f32[4,3072], f32[4,1536]) {
  %x = f32[4,3072]{1,0} parameter(0)
  %init = f32[] constant(-inf)
  %row = f32[4,3072]{1,0} reduce-window(%x, %init), window={size=1x6143 pad=0_0x3071_3071}, to_apply=%max
  %pairs = f32[4,1536]{1,0} reduce-window(%x, %init), window={size=1x2 stride=1x2}, to_apply=%max
  ROOT %t = (f32[4,3072]{1,0}, f32[4,1536]{1,0}) tuple(%row, %pairs)
}
"""
  assert hlo_flops.module_flops(text) == 4 * 3072 + 4 * 1536 * 1
