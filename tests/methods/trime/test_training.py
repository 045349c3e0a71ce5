"""The TRIME objective through the run's objective and the train step (8 fake
devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import trime_wt103
from memjax import build
from memjax import config as config_lib
from memjax import losses
from memjax.methods.trime import objective
from memjax import sharding as sharding_lib
from memjax.run import step as train_step
from memjax.methods.trime import in_batch as trime
from memjax.models import transformer
from tests.models import helpers
from tests.methods.trime import test_in_batch


def _model():
  return transformer.TransformerLM(
      cfg=helpers.tiny(
          32,
          num_layers=2,
          cutoffs=(8, 20),
          dropout=0.0,
      )
  )


def _loss_cfg(memory, **kw):
  """A config whose objective is TRIME's with ``memory`` (seed 0)."""
  cfg = config_lib.base_config()
  cfg.loss.name = "trime"
  cfg.trime.update(
      dict(
          memory=memory,
          lm_warmup_fraction=0.0,
          local_hide_prob=0.9,
          stop_gradient_memory=False,
          block_size=16,
      )
  )
  cfg.trime.update(kw)
  return cfg


def _make_loss(cfg, num_steps):
  """The objective ``cfg.loss.name`` of ``cfg``'s settings over
  ``num_steps`` updates (what ``Run.objective`` builds)."""
  parts = build.parts()
  settings = build.read(cfg, parts)
  return parts.objectives.get(settings.loss.name)(settings, num_steps)


def _batch(rows=8, seq_len=6, lanes=4):
  rng = np.random.default_rng(0)
  # A small vocabulary so that memories hold positives; the rows of a lane
  # repeat one sequence, which only the long memory sees from the next row.
  toks = rng.integers(0, 12, (lanes, seq_len + 1)).astype(np.int32)
  toks = np.repeat(toks, rows // lanes, axis=0)
  return {
      "inputs": toks[:, :-1],
      "targets": toks[:, 1:],
      "lane_id": np.repeat(np.arange(lanes, dtype=np.int32), rows // lanes),
  }


def _run_step(memory, mesh_spec, devices=None, grad_accum=1):
  model = _model()
  batch = _batch()
  tx = optax.adam(1e-2)
  mesh = sharding_lib.make_mesh(mesh_spec, devices)
  state, shardings = train_step.create_state(
      model, tx, mesh, batch, jax.random.PRNGKey(0)
  )
  step = train_step.make_train_step(
      model,
      tx,
      _make_loss(_loss_cfg(memory), 10),
      grad_accum=grad_accum,
      state_shardings=shardings,
      mesh=mesh,
  )
  state, m = step(
      state, sharding_lib.put_global_batch(batch, mesh), jax.random.PRNGKey(1)
  )
  return jax.device_get(m), jax.device_get(state.params)


@pytest.fixture(scope="module")
def unsharded():
  one = jax.devices()[:1]
  return {mem: _run_step(mem, {"data": 1}, one) for mem in ("local", "long")}


@pytest.mark.parametrize(
    "memory,mesh_spec",
    [
        ("local", {"data": 4, "tensor": 2}),
        ("long", {"data": 8}),
    ],
)
def test_trime_train_step_sharded_equals_unsharded(
    unsharded, memory, mesh_spec
):
  ref_m, ref_params = unsharded[memory]
  m, params = _run_step(memory, mesh_spec)
  assert float(m["aux_memory_on_sum"]) == float(m["tokens"]) > 0
  np.testing.assert_allclose(m["loss"], ref_m["loss"], rtol=1e-5)
  np.testing.assert_allclose(
      m["aux_memory_share_sum"], ref_m["aux_memory_share_sum"], rtol=1e-4
  )
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      params,
      ref_params,
  )


def test_long_memory_reaches_across_rows_and_local_does_not(unsharded):
  """The long loss is lower than the local one on repetitive data."""
  local_m, _ = unsharded["local"]
  long_m, _ = unsharded["long"]
  assert long_m["aux_with_positive_sum"] > local_m["aux_with_positive_sum"]
  assert long_m["loss"] < local_m["loss"]


def _outputs(seed=0, rows=4, length=5, d=8):
  rng = np.random.default_rng(seed)
  out = transformer.LMOutput(
      target_logprob=jnp.asarray(
          -rng.uniform(1, 3, (rows, length)), jnp.float32
      ),
      log_z=jnp.asarray(rng.normal(size=(rows, length)), jnp.float32),
      features=jnp.asarray(rng.normal(size=(rows, length, d)), jnp.float32),
      hidden=jnp.zeros((rows, length, d)),
  )
  batch = {
      "targets": jnp.asarray(rng.integers(0, 4, (rows, length)), jnp.int32),
      "lane_id": jnp.asarray([0, 0, 1, 1], jnp.int32),
  }
  return out, batch


@pytest.mark.parametrize("memory", ["local", "long", "external"])
def test_warmup_uses_the_plain_loss_then_trime(memory):
  out, batch = _outputs()
  loss_fn = jax.jit(
      _make_loss(_loss_cfg(memory, lm_warmup_fraction=0.1), 100),
      static_argnames=(),
  )
  w = jnp.ones(batch["targets"].shape)
  plain, _ = losses.lm_loss(out, batch, step=0, rng=None)
  early, m_early = loss_fn(out, batch, step=jnp.int32(9), rng=None)
  late, m_late = loss_fn(out, batch, step=jnp.int32(10), rng=None)
  assert float(early) == pytest.approx(float(plain), rel=1e-6)
  assert float(m_early["aux_memory_on_sum"]) == 0.0
  if memory == "long":
    spec = objective.long_memory_spec(batch["lane_id"])
  elif memory == "external":
    spec = trime.MemorySpec.external(
        objective.hide_local_draw(0, jnp.int32(10), 0.9)
    )
  else:
    spec = trime.MemorySpec.local()
  # The objective after the warm-up is trime_loss with the step's memory.
  direct, _ = trime.trime_loss(
      out.features,
      out.target_logprob,
      out.log_z,
      batch["targets"],
      w,
      spec=spec,
      block_size=16,
  )
  assert float(late) == pytest.approx(float(direct), rel=1e-6)
  # Eq. 5 by explicit float64 loops: a lane's rows are its segments in
  # row order; TRIMELM_ext hides the local memory when the draw says so.
  ref = test_in_batch.ref_log_prob(
      out.features,
      out.target_logprob,
      out.log_z,
      np.asarray(batch["targets"]),
      np.asarray(w),
      memory,
      doc_id=[0, 0, 1, 1],
      seg=[0, 1, 2, 3],
      hide_local=bool(objective.hide_local_draw(0, jnp.int32(10), 0.9)),
  )
  assert float(late) == pytest.approx(-np.mean(ref), rel=1e-5)
  assert float(m_late["aux_memory_on_sum"]) == float(m_late["tokens"])
  assert float(m_late["nll_sum"]) == pytest.approx(float(late) * 20, rel=1e-6)
  aux = losses.summarize_aux(jax.device_get(m_late))
  assert aux["memory_on"] == 1.0 and aux["lm_loss"] == pytest.approx(
      float(plain)
  )


def test_hide_local_is_drawn_once_per_step_with_probability_p():
  draw = jax.jit(jax.vmap(lambda s: objective.hide_local_draw(3, s, 0.9)))
  steps = jnp.arange(4000)
  a, b = np.asarray(draw(steps)), np.asarray(draw(steps))
  np.testing.assert_array_equal(a, b)  # a function of (seed, step) only
  assert abs(a.mean() - 0.9) < 0.02
  other = np.asarray(
      jax.vmap(lambda s: objective.hide_local_draw(4, s, 0.9))(steps)
  )
  assert (other != a).any()


def test_stop_gradient_memory_changes_only_the_gradient():
  out, batch = _outputs()
  f = lambda stop: _make_loss(_loss_cfg("local", stop_gradient_memory=stop), 10)

  def grad_of(fn):
    def loss(g):
      return fn(out.replace(features=g), batch, step=5, rng=None)[0]

    return jax.jit(jax.value_and_grad(loss))(out.features)

  (v1, g1), (v2, g2) = grad_of(f(False)), grad_of(f(True))
  assert float(v1) == pytest.approx(float(v2), rel=1e-6)
  assert not np.allclose(g1, g2)


def test_bad_loss_settings_raise_one_clear_error(tmp_path):
  # Refused when the run is built, before anything is written.
  with pytest.raises(ValueError, match="trime.memory"):
    build.build(_loss_cfg("global"), str(tmp_path))
  with pytest.raises(ValueError, match="local_hide_prob"):
    build.build(_loss_cfg("external", local_hide_prob=1.5), str(tmp_path))
  with pytest.raises(ValueError, match="lm_warmup_fraction"):
    build.build(_loss_cfg("local", lm_warmup_fraction=-0.1), str(tmp_path))
  out, batch = _outputs()
  del batch["lane_id"]
  with pytest.raises(ValueError, match="lane_id"):
    _make_loss(_loss_cfg("long"), 10)(out, batch, step=0, rng=None)
  cfg = trime_wt103.get_config("trime_long_smoke")
  cfg.data.batching = "random"
  with pytest.raises(ValueError, match="blocks"):
    build.build(cfg, str(tmp_path))
  cfg = trime_wt103.get_config("trime_long_smoke")
  cfg.train.grad_accum = 4  # micro-batches of 2 rows split lanes of 4
  with pytest.raises(ValueError, match="not a multiple"):
    build.build(cfg, str(tmp_path))


@pytest.mark.parametrize(
    "variant",
    [
        "trime_7m",
        "trime_long_7m",
        "trime_ext_7m",
        "trime_long_150m",
        "trime_long_247m",
    ],
)
def test_paper_sizes_keep_table_9_in_batch_memories(variant, tmp_path):
  cfg = trime_wt103.get_config(variant)
  micro = cfg.data.batch_size // cfg.train.grad_accum
  expected = {"7m": 24576, "150m": 9000, "247m": 24576}[variant.split("_")[-1]]
  assert micro * cfg.data.seq_len == expected
  build.build(cfg, str(tmp_path))
