"""What the training loop logs for the steps since its last log."""

import numpy as np
import pytest

from memjax import losses


def test_interval_scalars_are_means_over_the_steps():
  # Two steps, worked by hand. The objective's token-weighted sums become
  # per-token values per step (12/4 = 3 and 10/5 = 2), then their mean;
  # a plain aux value is averaged as it is; module statistics add their
  # (weighted sum, weight) pairs over the steps: (2 + 6) / (1 + 3) = 2.
  steps = [
      {
          "loss": np.float32(4.0),
          "grad_norm": np.float32(1.0),
          "tokens": np.float32(4.0),
          "aux_memory_nll_sum": np.float32(12.0),
          "aux_lambda": np.float32(0.25),
          "stats": {"layer_0/alpha": np.array([2.0, 1.0], np.float32)},
      },
      {
          "loss": np.float32(2.0),
          "grad_norm": np.float32(3.0),
          "tokens": np.float32(5.0),
          "aux_memory_nll_sum": np.float32(10.0),
          "aux_lambda": np.float32(0.75),
          "stats": {"layer_0/alpha": np.array([6.0, 3.0], np.float32)},
      },
  ]
  out = losses.interval_scalars(steps)
  assert out == pytest.approx(
      {
          "train/loss": 3.0,
          "train/grad_norm": 2.0,
          "train/memory_nll": 2.5,
          "train/lambda": 0.5,
          "train/aux/layer_0/alpha": 2.0,
      }
  )


def test_one_step_logs_that_step():
  step = {"loss": 1.5, "grad_norm": 0.5, "tokens": 2.0, "aux_x_sum": 3.0}
  assert losses.interval_scalars([step]) == pytest.approx(
      {"train/loss": 1.5, "train/grad_norm": 0.5, "train/x": 1.5}
  )
