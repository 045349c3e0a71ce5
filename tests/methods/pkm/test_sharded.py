"""The memory's rows split over devices: sharded equals unsharded on 8
fake CPU devices, in the layer, in evaluation and in a training step."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from memjax import losses
from memjax import sharding as sharding_lib
from memjax.methods.pkm import layer as pkm
from memjax.models import variables as model_vars
from memjax.models import transformer
from memjax.run import step as train_step
from tests.models import helpers

D, H, K, KD = 12, 2, 3, 8
MESHES = [
    {"data": 2, "fsdp": 1, "tensor": 4},
    {"data": 1, "memory": 8},
    {"data": 2, "memory": 4},
    {"data": 2, "tensor": 2, "memory": 2},
]


def _rows_split(spec):
  return spec.get("memory", 1) * spec.get("tensor", 1)


@pytest.mark.parametrize("spec", MESHES)
def test_layer_sharded_equals_unsharded(spec):
  options = pkm.MemoryOptions(num_keys=8, heads=H, topk=K, k_dim=KD)
  layer = pkm.ResMFeedForward(d_model=D, d_ff=24, options=options)
  x = np.random.default_rng(6).normal(size=(8, 3, D)).astype(np.float32)
  boxed = layer.init(jax.random.PRNGKey(0), x, deterministic=True)["params"]
  params = nn.meta.unbox(boxed)

  def loss_and_grads(params, x):
    def f(p):
      y, sums = model_vars.apply(layer, {"params": p}, x, deterministic=True)
      return jnp.sum(jnp.sin(y)), sums

    return jax.value_and_grad(f, has_aux=True)(params)

  want = jax.device_get(jax.jit(loss_and_grads)(params, x))
  mesh = sharding_lib.make_mesh(spec)
  shardings = sharding_lib.logical_sharding(mesh, nn.get_partition_spec(boxed))
  sharded = jax.device_put(params, shardings)
  values = sharded["memory"]["values"]
  assert values.addressable_shards[0].data.shape == (64 // _rows_split(spec), D)
  xs = sharding_lib.put_global_batch({"x": x}, mesh)["x"]
  fn = sharding_lib.jit(loss_and_grads, mesh)
  got = jax.device_get(fn(sharded, xs))
  (l1, s1), g1 = want
  (l2, s2), g2 = got
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  m1, m2 = model_vars.means(s1), model_vars.means(s2)
  assert set(m1) == {f"memory/{k}" for k in ("mu", "top1_mu", "kl_u", "kl_w")}
  for k in m1:
    np.testing.assert_allclose(m1[k], m2[k], rtol=1e-5, atol=1e-6)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      g1,
      g2,
  )


def _lm():
  return transformer.TransformerLM(
      cfg=helpers.config(
          32,
          num_layers=2,
          d_model=D,
          num_heads=4,
          head_dim=3,
          d_ff=24,
          feed_forward_options=dict(num_keys=8, heads=H, topk=K, k_dim=KD),
          feed_forward_layers=(2,),
          feed_forward="pkm",
      )
  )


@pytest.mark.parametrize(
    "spec", [{"data": 1, "memory": 8}, {"data": 2, "tensor": 2, "memory": 2}]
)
def test_train_step_and_eval_sharded_equal_unsharded(spec):
  model, tx = _lm(), optax.adam(1e-2)
  toks = np.random.default_rng(7).integers(0, 32, (8, 7)).astype(np.int32)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:]}
  results = []
  for mesh_spec, devices in (({"data": 1}, jax.devices()[:1]), (spec, None)):
    mesh = sharding_lib.make_mesh(mesh_spec, devices)
    state, shardings = train_step.create_state(
        model, tx, mesh, batch, jax.random.PRNGKey(0)
    )
    step = train_step.make_train_step(
        model,
        tx,
        losses.lm_loss,
        grad_accum=1,
        state_shardings=shardings,
        mesh=mesh,
    )
    put = sharding_lib.put_global_batch(batch, mesh)
    values = state.params["layer_1"]["ffn"]["memory"]["values"]
    rows = values.addressable_shards[0].data.shape[0]
    moments = state.opt_state[0].mu["layer_1"]["ffn"]["memory"]["values"]
    assert moments.addressable_shards[0].data.shape[0] == rows
    state, metrics = step(state, put, jax.random.PRNGKey(1))
    evaluate = sharding_lib.jit(
        lambda p, b: model.apply(
            {"params": p}, b["inputs"], b["targets"], deterministic=True
        ).target_logprob,
        mesh,
    )
    results.append(
        (
            rows,
            float(metrics["loss"]),
            jax.device_get(state.params),
            np.asarray(evaluate(state.params, put)),
        )
    )
  (rows1, loss1, p1, e1), (rows2, loss2, p2, e2) = results
  assert (rows1, rows2) == (64, 64 // _rows_split(spec))
  assert loss1 == pytest.approx(loss2, rel=1e-5)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      p1,
      p2,
  )
  np.testing.assert_allclose(e1, e2, rtol=1e-5, atol=1e-5)
