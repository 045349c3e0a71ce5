"""The begin- and end-of-sequence ids an imported model names.

Hugging Face keeps them in two files: ``config.json``'s ``bos_token_id``
and ``eos_token_id``, and ``generation_config.json``'s, which ``generate``
reads (Llama 3.1 Instruct lists ``<|end_of_text|>``, ``<|eom_id|>`` and
``<|eot_id|>``; Llama 3 Instruct's config.json names only the first, its
generation_config.json the first and the last). Each may be an int,
a list of ints or null. The import keeps every EOS id of
generation_config.json, else of config.json (generation stops at any of
them), and the BOS of either (generation_config.json's first).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from memjax import errors
from memjax.io import paths

GENERATION_CONFIG = "generation_config.json"


def as_ids(value: Any) -> tuple[int, ...]:
  """An id field (an int, a list of ints or None) as a tuple of ids."""
  if value is None:
    return ()
  if isinstance(value, (list, tuple)):
    return tuple(int(v) for v in value if v is not None)
  return (int(value),)


def generation_config(folder: str) -> dict[str, Any]:
  """The folder's generation_config.json, or {} when it has none.

  Raises:
    errors.DataError: a file that is not a JSON object.
  """
  path = paths.join(folder, GENERATION_CONFIG)
  if not paths.isfile(path):
    return {}
  try:
    out = json.loads(paths.read_text(path))
  except ValueError as e:
    raise errors.DataError(f"{path} is not JSON ({e})") from None
  if not isinstance(out, dict):
    raise errors.DataError(f"{path} is not a JSON object")
  return out


def read(folder: str, hf: dict[str, Any]) -> tuple[Optional[int], tuple]:
  """(the BOS id or None, every EOS id) of the model in ``folder``, whose
  config.json is ``hf``.

  Raises:
    errors.DataError: a generation_config.json that is not a JSON object.
  """
  gen = generation_config(folder)
  bos = as_ids(gen.get("bos_token_id")) or as_ids(hf.get("bos_token_id"))
  eos = as_ids(gen.get("eos_token_id")) or as_ids(hf.get("eos_token_id"))
  return (bos[0] if bos else None), eos
