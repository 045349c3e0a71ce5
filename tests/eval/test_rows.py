"""The padded-batch helper and the base scorer's rows, against direct calls."""

import jax
import numpy as np
import pytest

from memjax import sharding as sharding_lib
from memjax.models import variables as model_vars
from memjax.eval import rows
from memjax.models import transformer
from tests.models import helpers


def test_batches_are_rounded_up_and_padded_with_zero_rows():
  mesh = sharding_lib.make_mesh({"data": 8})
  assert rows.batch_rows(5, mesh) == 8 and rows.batch_rows(9, mesh) == 16
  arrays = {"inputs": np.arange(1, 21).reshape(10, 2)}
  got = list(rows.row_batches(arrays, 5, mesh))
  assert [real for _, real in got] == [8, 2]
  last = got[1][0]["inputs"]
  assert last.shape == (8, 2)
  np.testing.assert_array_equal(last[:2], [[17, 18], [19, 20]])
  assert not last[2:].any()
  dropped = list(rows.row_batches(arrays, 5, mesh, drop_remainder=True))
  assert [real for _, real in dropped] == [8]


def test_add_up_sums_in_float64():
  total = rows.add_up(None, {"a": np.float32(1e8), "b": {"c": np.ones(2)}})
  total = rows.add_up(total, {"a": np.float32(1.0), "b": {"c": np.ones(2)}})
  assert total["a"].dtype == np.float64 and total["a"] == 1e8 + 1
  np.testing.assert_array_equal(total["b"]["c"], [2.0, 2.0])


@pytest.fixture(name="lm")
def _lm():
  model = transformer.TransformerLM(
      cfg=helpers.config(
          30, num_layers=1, d_model=16, num_heads=2, head_dim=8, d_ff=32
      )
  )
  x = np.zeros((1, 6), np.int32)
  params = model.init(jax.random.key(0), x, x)["params"]
  return model, params


@pytest.mark.parametrize("devices", [1, 8])
def test_rows_equal_one_direct_call(lm, devices):
  model, params = lm
  mesh = sharding_lib.make_mesh({"data": devices}, jax.devices()[:devices])
  rng = np.random.default_rng(0)
  arrays = {
      "inputs": rng.integers(1, 30, (11, 6)).astype(np.int32),
      "targets": rng.integers(1, 30, (11, 6)).astype(np.int32),
      "weights": (rng.random((11, 6)) > 0.3).astype(np.float32),
      "position": np.zeros((11, 6), np.int32),  # not a model input: ignored
  }
  scorer = rows.Scorer(rows.Scoring(model, mesh))
  out = scorer.rows(
      params,
      arrays,
      batch_size=4,
      keep=("target_logprob",),
      collections=(model_vars.COLLECTION,),
  )
  want = model.apply(
      {"params": params}, arrays["inputs"], arrays["targets"]
  ).target_logprob
  np.testing.assert_allclose(out["target_logprob"], want, rtol=1e-5, atol=1e-6)
  w = arrays["weights"]
  assert out["tokens"] == pytest.approx(w.sum())
  assert out["nll_sum"] == pytest.approx(-(np.asarray(want) * w).sum(), 1e-5)
  assert out[model_vars.COLLECTION] == {}  # the plain model reports nothing


def test_apply_takes_batches_of_their_own_lengths(lm):
  # Batches padded to their own length bucket (as the classifier's are):
  # one compilation each, sums over the real rows only.
  model, params = lm
  mesh = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  rng = np.random.default_rng(1)
  a = rng.integers(1, 30, (3, 4)).astype(np.int32)
  b = rng.integers(1, 30, (3, 7)).astype(np.int32)
  scorer = rows.Scorer(rows.Scoring(model, mesh))
  wb = np.ones((3, 7), np.float32)
  wb[2] = 0.0  # a padding row
  out = scorer.apply(
      params,
      [
          ({"inputs": a, "targets": a}, 3),
          ({"inputs": b, "targets": b, "weights": wb}, 2),
      ],
  )
  want = sum(
      -float((model.apply({"params": params}, x, x).target_logprob * w).sum())
      for x, w in ((a, np.ones((3, 4))), (b, wb))
  )
  assert out["nll_sum"] == pytest.approx(want, rel=1e-5)
  assert out["tokens"] == 3 * 4 + 2 * 7
  # The base scorer runs rows only; it names what scores streams.
  with pytest.raises(TypeError, match="scorer_for"):
    scorer.score(params, a[0])
