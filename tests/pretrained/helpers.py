"""What the pretrained-model tests share: the fixtures, and the log-
probabilities a restored model gives over the whole vocabulary, the
quantity compared with Hugging Face's stored logits."""

import os
from typing import Any, Optional

import jax
import numpy as np

from tests.conftest import REPO

FIXTURES = os.path.join(REPO, "tests", "fixtures", "pretrained")
# The fixtures with Hugging Face's logits on fixed inputs (expected.npz).
NAMES = (
    "gpt2",
    "llama_gqa",
    "llama3_scaled",
    "qwen2",
    "mistral_window",
    "qwen3",
    "llama_linear",
    "gemma3_text",
    "gemma3",
    "qwen2_window",
    "llama_yarn",
)
# Those whose folder holds the language model alone (gemma3 nests it
# beside a vision tower).
TEXT_NAMES = tuple(n for n in NAMES if n != "gemma3")


def log_probs(
    restored: Any, ids: np.ndarray, params: Optional[Any] = None
) -> np.ndarray:
  """[B, L, V] log-probabilities of ``restored``'s model (with ``params``,
  default its own) on ids [B, L]."""
  variables = {"params": restored.params if params is None else params}
  model = restored.model
  hidden, _, _ = model.apply(variables, ids, method=model.hidden_states)
  return np.asarray(model.apply(variables, hidden, method=model.log_probs))


def hf_log_probs(expected: Any) -> np.ndarray:
  """[B, L, V] float64 log-probabilities of Hugging Face's stored logits
  (an expected.npz)."""
  return jax.nn.log_softmax(expected["logits"].astype(np.float64), axis=-1)
