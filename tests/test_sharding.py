"""Sharded training equals unsharded training on 8 fake CPU devices."""

import jax
import numpy as np
import optax
import pytest

from memjax import losses
from memjax import sharding as sharding_lib
from memjax.models import transformer
from memjax.run import step as train_step
from tests.models import helpers


def _model():
  return transformer.TransformerLM(
      cfg=helpers.config(
          64,
          num_layers=2,
          d_model=32,
          num_heads=4,
          head_dim=8,
          d_ff=64,
          cutoffs=(8, 24),
          dropout=0.0,
      )
  )


def _batch(batch_size=8, seq_len=12):
  rng = np.random.default_rng(0)
  toks = rng.integers(0, 64, (batch_size, seq_len + 1)).astype(np.int32)
  return {"inputs": toks[:, :-1], "targets": toks[:, 1:]}


def _loss_and_grads(model, params, batch):
  def f(p):
    out = model.apply({"params": p}, batch["inputs"], batch["targets"])
    return losses.lm_loss(out, batch, step=0, rng=None)[0]

  return jax.value_and_grad(f)(params)


@pytest.fixture(scope="module")
def reference():
  model = _model()
  batch = _batch()
  one = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  state, _ = train_step.create_state(
      model, optax.sgd(0.1), one, batch, jax.random.PRNGKey(0)
  )
  params = jax.device_get(state.params)
  loss, grads = jax.jit(_loss_and_grads, static_argnums=0)(model, params, batch)
  return model, batch, params, loss, jax.device_get(grads)


@pytest.mark.parametrize(
    "mesh_spec",
    [
        {"data": 4, "fsdp": 1, "tensor": 2},
        {"data": 2, "fsdp": 2, "tensor": 2},
    ],
)
def test_loss_and_grads_equal_sharded(reference, mesh_spec):
  assert len(jax.devices()) == 8
  model, batch, params, ref_loss, ref_grads = reference
  mesh = sharding_lib.make_mesh(mesh_spec)
  state, shardings = train_step.create_state(
      model, optax.sgd(0.1), mesh, batch, jax.random.PRNGKey(0)
  )
  # The parameters really are split over the mesh.
  kernel = state.params["layer_0"]["ffn"]["wi"]["kernel"]
  assert (
      kernel.sharding.spec
      == shardings.params["layer_0"]["ffn"]["wi"]["kernel"].spec
  )
  assert len(kernel.addressable_shards) == 8
  assert kernel.addressable_shards[0].data.shape != kernel.shape
  sharded_params = jax.device_put(params, shardings.params)
  sharded_batch = sharding_lib.put_global_batch(batch, mesh)
  fn = sharding_lib.jit(_loss_and_grads, mesh, static_argnums=0)
  loss, grads = fn(model, sharded_params, sharded_batch)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
      jax.device_get(grads),
      ref_grads,
  )


def test_train_step_sharded_with_accumulation_equals_unsharded():
  model = _model()
  batch = _batch()
  tx = optax.adam(1e-3)
  results = []
  for spec, accum, devices in [
      ({"data": 1}, 1, jax.devices()[:1]),
      ({"data": 2, "fsdp": 2, "tensor": 2}, 2, None),
  ]:
    mesh = sharding_lib.make_mesh(spec, devices)
    state, shardings = train_step.create_state(
        model, tx, mesh, batch, jax.random.PRNGKey(0)
    )
    step = train_step.make_train_step(
        model,
        tx,
        losses.lm_loss,
        grad_accum=accum,
        state_shardings=shardings,
        mesh=mesh,
    )
    state, m = step(
        state, sharding_lib.put_global_batch(batch, mesh), jax.random.PRNGKey(1)
    )
    results.append((float(m["loss"]), jax.device_get(state.params)))
  assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      results[0][1],
      results[1][1],
  )


def test_mesh_errors_name_the_problem():
  with pytest.raises(sharding_lib.MeshError, match="8 are available"):
    sharding_lib.make_mesh({"data": 3, "fsdp": 1, "tensor": 1})
  mesh = sharding_lib.make_mesh({"data": 4, "tensor": 2})
  with pytest.raises(sharding_lib.MeshError, match="not divisible") as e:
    sharding_lib.check_batch(mesh, 6)
  # The line names the keys to change and values that work.
  message = str(e.value)
  assert "--config.data.batch_size=8" in message
  assert (
      "--config.mesh.data=2 --config.mesh.fsdp=1 --config.mesh.memory=1 --config.mesh.tensor=4"
      in (message)
  )
  sharding_lib.check_batch(mesh, 8)
  sharding_lib.check_batch(
      sharding_lib.make_mesh({"data": 2, "fsdp": 1, "tensor": 4}), 6
  )
  # Two micro-batches per step: the proposed batch holds both.
  with pytest.raises(sharding_lib.MeshError, match="batch_size=16,"):
    sharding_lib.check_batch(mesh, 6, rows_per_unit=2)
  with pytest.raises(sharding_lib.MeshError, match="unknown mesh axes"):
    sharding_lib.make_mesh({"model": 8})


def test_divisible_leaves_small_dimensions_whole():
  # Split 8 ways where a dimension divides by 8; whole where it does not.
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  mesh = sharding_lib.make_mesh({"data": 1, "fsdp": 8}, jax.devices())
  shard = NamedSharding(mesh, P("tensor", "fsdp"))
  shapes = {
      "big": jax.ShapeDtypeStruct((3, 16), np.float32),
      "small": jax.ShapeDtypeStruct((263737, 2), np.float32),
  }
  out = sharding_lib.divisible({"big": shard, "small": shard}, shapes)
  assert out["big"].spec == P("tensor", "fsdp")
  assert out["small"].spec == P("tensor", None)
  assert out["small"].shard_shape((263737, 2)) == (263737, 2)
