"""benchmarks/pkm_benchmark.py's parts beside the models' train steps:
the memory layer alone (search and read apart) and the values update, at
smoke size, each called once as the benchmark calls them."""

import jax
import numpy as np

from benchmarks import pkm_benchmark


def test_layer_parts_and_values_update_run_at_smoke_size():
  cfg = pkm_benchmark.make_config("pkm", "smoke", [])
  layers, params, temps = pkm_benchmark.layer_benches(cfg)
  names = [b.name for b in layers]
  assert names[:2] == ["memory_search", "memory_read"]
  assert names[-2:] == ["memory_layer_bag", "memory_layer_gather"]
  assert params > 0 and set(temps) == set(names)
  assert all(t >= 0 for t in temps.values())
  optimizers, read = pkm_benchmark.optimizer_benches(cfg)
  assert [b.name for b in optimizers] == ["adam", "lazy_adam"]
  assert 0 < read <= 1
  for bench in layers + optimizers:
    assert bench.run(1) > 0, bench.name
  # Both optimisers move the rows read the same way on a first step from
  # zero moments (Adam's first step is lr * sign(g) either way).
  (adam_p, _), (lazy_p, _) = (b.fn(*b.args) for b in optimizers)
  np.testing.assert_allclose(
      np.asarray(jax.device_get(adam_p)),
      np.asarray(jax.device_get(lazy_p)),
      rtol=1e-5,
      atol=1e-7,
  )
