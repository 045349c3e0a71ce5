"""Learning-rate schedules and optimisers of memjax.run.optim against NumPy."""

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from memjax import build
from memjax import config as config_lib
from memjax import settings as settings_lib
from memjax.run import optim

LR = 0.01
Params = dict[str, np.ndarray]  # {"a": [3], "b": [2, 2]}


def optim_cfg(**overrides: Any) -> settings_lib.Optim:
  """The base config's ``optim`` with overrides, as typed settings."""
  cfg = config_lib.base_config().optim
  cfg.learning_rate = LR
  for key, value in overrides.items():
    cfg[key] = value
  return settings_lib.read(settings_lib.Optim, cfg)


def make_optimizer(
    cfg: settings_lib.Optim, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """``optim.make_optimizer`` with the declared transforms."""
  transforms = build.parts().optimizer_transforms
  return optim.make_optimizer(cfg, num_steps, transforms)


def values(sched: optax.Schedule, steps: list[int]) -> np.ndarray:
  return np.array([float(sched(jnp.asarray(s))) for s in steps])


@pytest.mark.parametrize("warm,ratio", [(10, 0.1), (0, 0.0)])
def test_cosine_warms_up_then_decays_to_min_lr_ratio(
    warm: int, ratio: float
) -> None:
  num_steps = 50
  sched = optim.make_schedule(
      optim_cfg(schedule="cosine", warmup_steps=warm, min_lr_ratio=ratio),
      num_steps,
  )
  end = ratio * LR

  def want(step):
    if step < warm:
      return LR * step / warm
    frac = min(step - warm, num_steps - warm) / (num_steps - warm)
    return end + (LR - end) * 0.5 * (1.0 + math.cos(math.pi * frac))

  mid = warm + (num_steps - warm) // 2
  steps = [0, 1, warm // 2, warm, warm + 3, mid, num_steps - 1, num_steps]
  steps += [num_steps + 7]  # stays at the end value
  np.testing.assert_allclose(
      values(sched, steps), [want(s) for s in steps], rtol=1e-5, atol=1e-9
  )
  assert float(sched(warm)) == pytest.approx(LR)
  assert float(sched(mid)) == pytest.approx((LR + end) / 2, rel=1e-5)
  assert float(sched(num_steps)) == pytest.approx(end, abs=1e-9)
  if warm:
    assert float(sched(0)) == 0.0


@pytest.mark.parametrize("warm", [8, 0])
def test_inverse_sqrt_warms_up_then_decays_as_one_over_sqrt_step(
    warm: int,
) -> None:
  sched = optim.make_schedule(
      optim_cfg(schedule="inverse_sqrt", warmup_steps=warm), 100
  )

  def want(step):
    if step < warm:
      return LR * step / warm
    return LR * math.sqrt(max(warm, 1) / step)

  steps = [1, 3, 7, 8, 9, 32, 200]
  np.testing.assert_allclose(
      values(sched, steps), [want(s) for s in steps], rtol=1e-6
  )
  # Step 0 is treated as step 1 (no zero learning rate, no division by 0).
  assert float(sched(0)) == pytest.approx(float(sched(1)))


@pytest.mark.parametrize("warm", [4, 0])
def test_constant_warms_up_then_stays(warm: int) -> None:
  sched = optim.make_schedule(
      optim_cfg(schedule="constant", warmup_steps=warm), 100
  )
  steps = [0, 1, 2, 4, 5, 99, 1000]
  want = [LR * min(s / warm, 1.0) if warm else LR for s in steps]
  np.testing.assert_allclose(values(sched, steps), want, rtol=1e-6)


def test_unknown_schedule_and_optimizer_raise() -> None:
  with pytest.raises(ValueError, match="unknown optim.schedule 'step'"):
    optim.make_schedule(optim_cfg(schedule="step"), 10)
  with pytest.raises(ValueError, match="unknown optim.optimizer 'lamb'"):
    make_optimizer(optim_cfg(optimizer="lamb"), 10)


# ---------------------------------------------------------------------------
# Optimisers on a quadratic, against NumPy.
# ---------------------------------------------------------------------------

RNG = np.random.default_rng(0)
CURVATURE = {"a": RNG.uniform(0.5, 2.0, 3), "b": RNG.uniform(0.5, 2.0, (2, 2))}
TARGET = {"a": RNG.normal(size=3), "b": RNG.normal(size=(2, 2))}
START = {"a": RNG.normal(size=3), "b": RNG.normal(size=(2, 2))}


def grad(params: Params, scale: float) -> Params:
  """Gradient of scale * sum(0.5 * curvature * (p - target)^2)."""
  return {
      k: scale * CURVATURE[k] * (params[k] - TARGET[k]) for k in sorted(params)
  }


def clip(grads: Params, max_norm: float) -> Params:
  """optax.clip_by_global_norm: rescale all leaves when the norm exceeds."""
  if not max_norm:
    return grads
  norm = math.sqrt(sum(float(np.sum(g**2)) for g in grads.values()))
  factor = min(1.0, max_norm / norm)
  return {k: g * factor for k, g in grads.items()}


def warmup_lr(step: int, warm: int) -> float:
  """The 'constant' schedule: linear warm-up from 0, then LR."""
  return LR * min(step / warm, 1.0) if warm else LR


def run_optax(
    cfg: settings_lib.Optim, steps: int, scale: float
) -> list[Params]:
  """``steps`` updates of make_optimizer(cfg); params after each step."""
  tx, _ = make_optimizer(cfg, 100)
  params = {k: jnp.asarray(v, jnp.float32) for k, v in START.items()}
  state = tx.init(params)
  history = []
  for _ in range(steps):
    g = grad({k: np.asarray(v, np.float64) for k, v in params.items()}, scale)
    g = {k: jnp.asarray(v, jnp.float32) for k, v in g.items()}
    updates, state = tx.update(g, state, params)
    params = {k: params[k] + updates[k] for k in params}
    history.append({k: np.asarray(v) for k, v in params.items()})
  return history


def numpy_adamw(
    cfg: settings_lib.Optim, steps: int, scale: float
) -> list[Params]:
  """AdamW (decoupled weight decay, bias-corrected moments) in float64."""
  p = {k: v.copy() for k, v in START.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  history = []
  for t in range(1, steps + 1):
    g = clip(grad(p, scale), cfg.clip_norm)
    lr = warmup_lr(t - 1, cfg.warmup_steps)
    for k in p:
      m[k] = cfg.b1 * m[k] + (1 - cfg.b1) * g[k]
      v[k] = cfg.b2 * v[k] + (1 - cfg.b2) * g[k] ** 2
      m_hat = m[k] / (1 - cfg.b1**t)
      v_hat = v[k] / (1 - cfg.b2**t)
      p[k] = p[k] - lr * (
          m_hat / (np.sqrt(v_hat) + cfg.eps) + cfg.weight_decay * p[k]
      )
    history.append({k: x.copy() for k, x in p.items()})
  return history


def numpy_nesterov(
    cfg: settings_lib.Optim, steps: int, scale: float
) -> list[Params]:
  """SGD with Nesterov momentum as optax.sgd(nesterov=True): weight decay
  added to the (clipped) gradient, buf = mu buf + g, step g + mu buf."""
  p = {k: v.copy() for k, v in START.items()}
  buf = {k: np.zeros_like(v) for k, v in p.items()}
  history = []
  for t in range(steps):
    g = clip(grad(p, scale), cfg.clip_norm)
    lr = warmup_lr(t, cfg.warmup_steps)
    mu = cfg.momentum
    for k in p:
      d = g[k] + cfg.weight_decay * p[k]
      buf[k] = mu * buf[k] + d
      p[k] = p[k] - lr * (d + mu * buf[k])
    history.append({k: x.copy() for k, x in p.items()})
  return history


def assert_histories_close(got: list[Params], want: list[Params]) -> None:
  assert len(got) == len(want)
  for g, w in zip(got, want):
    for k in w:
      np.testing.assert_allclose(g[k], w[k], rtol=1e-5, atol=1e-7)


CASES = [
    # (overrides, gradient scale): plain; warm-up (step 0 has lr 0) and
    # weight decay; clipping that is active (large gradient).
    ({"warmup_steps": 0}, 1.0),
    ({"warmup_steps": 2, "weight_decay": 0.1}, 1.0),
    ({"warmup_steps": 0, "weight_decay": 0.1, "clip_norm": 0.5}, 20.0),
]
CASE_IDS = ["plain", "warmup_decay", "clipped"]


@pytest.mark.parametrize("overrides,scale", CASES, ids=CASE_IDS)
def test_adam_matches_numpy_adamw(overrides: dict, scale: float) -> None:
  cfg = optim_cfg(
      optimizer="adam",
      schedule="constant",
      b1=0.8,  # not optax's defaults
      b2=0.95,
      eps=1e-3,
      **overrides,
  )
  got = run_optax(cfg, 3, scale)
  assert_histories_close(got, numpy_adamw(cfg, 3, scale))
  if cfg.warmup_steps:
    for k in START:  # learning rate 0 at step 0
      np.testing.assert_allclose(got[0][k], START[k], rtol=1e-6)


@pytest.mark.parametrize("overrides,scale", CASES, ids=CASE_IDS)
def test_nag_matches_numpy_nesterov_momentum(
    overrides: dict, scale: float
) -> None:
  cfg = optim_cfg(
      optimizer="nag", schedule="constant", momentum=0.9, **overrides
  )
  got = run_optax(cfg, 3, scale)
  assert_histories_close(got, numpy_nesterov(cfg, 3, scale))


def test_clipping_comes_before_weight_decay() -> None:
  """With the gradient clipped first, weight decay is added unclipped;
  clipping the decayed gradient instead gives another step."""
  cfg = optim_cfg(
      optimizer="nag",
      schedule="constant",
      warmup_steps=0,
      weight_decay=0.5,
      clip_norm=0.1,
  )
  got = run_optax(cfg, 1, 20.0)[0]
  g = grad(START, 20.0)
  decayed_then_clipped = clip(
      {k: g[k] + cfg.weight_decay * START[k] for k in g}, cfg.clip_norm
  )
  mu = cfg.momentum
  other = {k: START[k] - LR * (1 + mu) * decayed_then_clipped[k] for k in START}
  assert max(np.abs(got[k] - other[k]).max() for k in START) > 1e-4
  assert_histories_close([got], numpy_nesterov(cfg, 1, 20.0))


def test_bfloat16_parameters_get_float32_state_and_rounded_float32_updates():
  cfg = optim_cfg(optimizer="adam", schedule="constant", warmup_steps=0)
  tx, _ = optim.make_optimizer(
      cfg, 10, build.parts().optimizer_transforms, "bfloat16"
  )
  rng = np.random.default_rng(0)
  p32 = {"a": rng.normal(size=3).astype(np.float32)}
  params = {"a": jnp.asarray(p32["a"], jnp.bfloat16)}
  state = tx.init(params)
  floats = [
      x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)
  ]
  assert floats and all(x.dtype == jnp.float32 for x in floats)
  ref_tx, _ = make_optimizer(cfg, 10)  # float32 Adam on the same values.
  ref_p = {"a": np.asarray(params["a"], np.float32)}
  ref_state = ref_tx.init(ref_p)
  for step in range(3):
    g = rng.normal(size=3).astype(np.float32)
    grads = {"a": jnp.asarray(g, jnp.bfloat16)}
    updates, state = tx.update(grads, state, params)
    assert updates["a"].dtype == jnp.float32
    params = optax.apply_updates(params, updates)
    assert params["a"].dtype == jnp.bfloat16
    # The reference: Adam in float32 on the bfloat16 values, rounded.
    ref_u, ref_state = ref_tx.update(
        {"a": np.asarray(grads["a"], np.float32)}, ref_state, ref_p
    )
    want = (ref_p["a"] + np.asarray(ref_u["a"])).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(params["a"]), np.asarray(want))
    ref_p = {"a": np.asarray(want, np.float32)}
