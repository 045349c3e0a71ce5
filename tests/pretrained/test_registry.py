"""memjax.pretrained.registry: the families by model_type, the tensor
reader."""

import numpy as np
import pytest

from memjax import errors
from memjax.pretrained import families
from memjax.pretrained import gemma
from memjax.pretrained import checkpoint
from memjax.pretrained import registry


def test_families_by_model_type():
  for kind in ("llama", "mistral", "qwen2", "qwen3"):
    assert registry.family_of({"model_type": kind}).settings is (
        families.llama_settings
    )
  for kind in ("gemma3", "gemma3_text"):
    assert registry.family_of({"model_type": kind}).params is (
        gemma.gemma3_params
    )
  with pytest.raises(errors.DataError, match="model_type 'bert'"):
    registry.family_of({"model_type": "bert"})


def test_take_tries_each_prefix_then_the_bare_name(tmp_path):
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top

  arrays = {
      "model.language_model.norm.weight": np.zeros(2, np.float16),
      "lm_head.weight": np.ones((2, 2), np.float32),
  }
  st.save_file(arrays, str(tmp_path / checkpoint.SINGLE))
  tensors = checkpoint.open_tensors(str(tmp_path))
  used = set()
  take = registry.taker(
      tensors, ("language_model.model.", "model.language_model."), used
  )
  got = take("norm.weight", (2,))
  assert got.dtype == np.float32 and got.shape == (2,)
  np.testing.assert_array_equal(take("lm_head.weight", (2, 2)), 1.0)
  assert used == set(arrays)
  with pytest.raises(errors.DataError, match="has shape \\(2,\\) but"):
    take("norm.weight", (3,))
  with pytest.raises(
      errors.DataError, match="no tensor language_model.model.x"
  ):
    take("x", (1,))
  tensors.close()
