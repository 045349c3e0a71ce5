"""The pretrained families by ``config.json``'s ``model_type``, and the
reader of a checkpoint's tensors the families' parameter functions use.

A family (``Family``) is its settings function (the language model's
config.json keys -> ``config.model``), its parameter function (the
model settings and ``take`` -> memjax's parameter tree; it only
rearranges tensors), the prefixes its tensors' names carry, and the
reader of the language model's keys out of a config.json (a multimodal
model nests them: Gemma 3 4B+'s ``text_config``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from memjax import errors
from memjax.pretrained import families
from memjax.pretrained import gemma

Tree = dict[str, Any]


def _itself(hf: Tree) -> Tree:
  return hf


class Family(NamedTuple):
  """A pretrained family.

  Attributes:
    settings: the language model's config.json keys -> ``config.model``.
    params: (the model settings and ``vocab_size``, ``take``) -> the
      parameter tree.
    prefixes: the prefixes of its tensors' names, tried in order (then the
      bare name).
    text: config.json -> the language model's keys.
  """

  settings: Callable[[Tree], Tree]
  params: Callable[..., Tree]
  prefixes: tuple[str, ...]
  text: Callable[[Tree], Tree] = _itself


LLAMA = Family(families.llama_settings, families.llama_params, ("model.",))
# model_type -> its family.
FAMILIES: dict[str, Family] = {
    "gpt2": Family(
        families.gpt2_settings, families.gpt2_params, ("transformer.",)
    ),
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "qwen3": LLAMA,
    "gemma3_text": Family(
        gemma.gemma3_settings, gemma.gemma3_params, ("model.",), gemma.text
    ),
    # Gemma3ForConditionalGeneration: the language model's tensors as
    # save_pretrained and the Hub name them, or as transformers 5 holds
    # them in memory.
    "gemma3": Family(
        gemma.gemma3_settings,
        gemma.gemma3_params,
        ("language_model.model.", "model.language_model."),
        gemma.text,
    ),
}


def family_of(hf: Tree) -> Family:
  """The family of a config.json (by its ``model_type``).

  Raises:
    errors.DataError: an unsupported model_type.
  """
  kind = hf.get("model_type")
  if kind not in FAMILIES:
    raise errors.DataError(
        f"config.json's model_type {kind!r} is not supported; memjax imports "
        f"{', '.join(sorted(FAMILIES))}"
    )
  return FAMILIES[kind]


def taker(
    tensors: Any,
    prefixes: Sequence[str],
    used: set[str],
    dtype: Any = np.float32,
) -> Callable[..., np.ndarray]:
  """``take(name, shape)``: the tensor ``prefix + name`` (the first of
  ``prefixes`` the checkpoint has) or ``name``, checked to have ``shape``
  before it is read, read in ``dtype``, noted in ``used``.

  Args:
    tensors: the checkpoint (``checkpoint.Tensors``: ``in``, ``shape``,
      ``read``).
    prefixes: the family's name prefixes ('model.').
    used: collects the names read.
    dtype: the dtype each tensor is converted to as it is read (the
      parameters' dtype).

  Raises:
    errors.DataError: the checkpoint lacks it, or it has another shape.
  """

  def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
    for key in [p + name for p in prefixes] + [name]:
      if key in tensors:
        used.add(key)
        if tuple(tensors.shape(key)) != tuple(shape):
          raise errors.DataError(
              f"the checkpoint's {key} has shape {tuple(tensors.shape(key))} "
              f"but config.json makes it {tuple(shape)}: the config.json and "
              "the safetensors files are of different models"
          )
        return tensors.read(key, dtype)
    raise errors.DataError(
        f"the checkpoint has no tensor {prefixes[0] + name}: the safetensors "
        "files are not this config.json's model, or are damaged"
    )

  return take
