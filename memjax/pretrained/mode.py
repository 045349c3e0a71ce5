"""``--mode=import``: a local Hugging Face folder as a memjax export.

    python -m memjax.main --config=configs/pretrained.py:import \\
        --config.pretrained.path=DIR --workdir=W --mode=import

reads DIR's ``config.json`` (the model's sizes and options: its
family in ``registry``), its safetensors checkpoint (``checkpoint``) and
``tokenizer.json`` (``vocab``), and writes into W an export (export.json,
config.json, vocab.json, tokenizer.json, params/, and hf/: DIR's own
config files, ``to_hf.keep_source``), which ``memjax.load``,
``--mode=eval`` and ``train.init_from`` take as they take any export. The
config's model section is replaced by the one config.json describes, so
a config names a family and a method, not sizes. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

import flax
import jax
import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.checkpoints import runfiles
from memjax.io import console
from memjax.io import paths
from memjax.models import blocks
from memjax.models import layer_layout
from memjax.pretrained import checkpoint
from memjax.pretrained import hf_config
from memjax.pretrained import registry
from memjax.pretrained import sizes
from memjax.pretrained import to_hf
from memjax.pretrained import special_ids
from memjax.data import tokenizer_vocab as vocab_lib
from memjax.run import spec
from memjax.run import step as step_lib

# What --mode=import writes into its workdir.
OUTPUTS = (
    "export.json",
    "config.json",
    "vocab.json",
    "tokenizer.json",
    "hf/config.json",
)


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """``config.pretrained``: the Hugging Face folder --mode=import reads.

  Attributes:
    path: the folder (config.json, model.safetensors or a sharded index,
      tokenizer.json): a local path or a URL.
  """

  SECTION: ClassVar[str] = "pretrained"
  path: str = ""


def _read_text(folder: str, name: str) -> str:
  """A file of the folder (DataError if absent)."""
  path = paths.join(folder, name)
  if not paths.isfile(path):
    raise errors.DataError(
        f"{folder} has no {name}: fetch the model's folder with its "
        "config.json, safetensors files and tokenizer.json (docs/pretrained.md)"
    )
  return paths.read_text(path)


def _read_json(folder: str, name: str) -> dict[str, Any]:
  """A JSON file of the folder (DataError if absent or unreadable)."""
  text = _read_text(folder, name)
  try:
    return json.loads(text)
  except ValueError as e:
    raise errors.DataError(f"{folder}/{name} is not JSON ({e})") from None


def _ids_of(hf: dict[str, Any]) -> dict[str, Any]:
  """config.json's own bos/eos ids, those it sets."""
  keys = ("bos_token_id", "eos_token_id")
  return {k: hf[k] for k in keys if hf.get(k) is not None}


def _folder(run: spec.Run) -> str:
  """The folder config.pretrained.path names, checked; the workdir checked
  empty (nothing is replaced)."""
  path = run.settings.of(Pretrained).path
  if not path:
    raise errors.ConfigError(
        "--mode=import needs --config.pretrained.path=DIR, a local folder "
        "holding a Hugging Face model (docs/pretrained.md)"
    )
  folder = paths.resolve(path)
  if not paths.isdir(folder):
    raise errors.DataError(f"config.pretrained.path {folder} is no folder")
  if paths.exists(run.workdir) and paths.listdir(run.workdir):
    raise errors.WorkdirError(
        f"{run.workdir} is not empty: import into a new or empty --workdir"
    )
  return folder


def _imported_run(run: spec.Run, model: dict[str, Any]) -> spec.Run:
  """The run with the model settings ``model`` (and evaluation windows and
  segments that fit its positions), its config_json saying so."""
  s = run.settings
  changes = {"model": model}
  changes.update(
      sizes.fitted(model, s.eval.window_len, s.eval.score_len, s.data.seq_len)
  )
  saved = json.loads(run.config_json)
  typed = {"model": s.model, "eval": s.eval, "data": s.data}
  sections = []
  for section, values in changes.items():
    saved.setdefault(section, {}).update(values)
    sections.append(settings_lib.replaced(typed[section], **values))
  return run.replace(
      *sections, config_json=json.dumps(saved, indent=2, sort_keys=True)
  )


def _pop(tree: dict[str, Any], path: str) -> Any:
  """Removes the leaf at 'a/b/c' from the nested ``tree`` and returns it."""
  *parents, name = path.split("/")
  for part in parents:
    tree = tree[part]
  return tree.pop(name)


def _params(run: spec.Run, vocab_size: int, tree: dict[str, Any]) -> Any:
  """The tree as the model's sharded parameters, in ``model.param_dtype``
  and in its layout (layers stacked where ``model.scan_layers`` stacks
  them); a tree that does not fit the model is a bug here (its traceback
  kept).

  ``tree`` is emptied as its arrays are placed, so the host copy and the
  placed one of the whole model never coexist.
  """
  model = run.model(vocab_size)
  abstract = step_lib.abstract_params(model, run.mesh)
  runs = layer_layout.stacked_blocks(abstract)
  if runs:  # The layers stacked in place: the per-layer arrays go.
    stacked = layer_layout.stack_layers(tree, runs)
    tree.clear()
    tree.update(stacked)
    del stacked
  want = flax.traverse_util.flatten_dict(abstract, sep="/")
  got = set(flax.traverse_util.flatten_dict(tree, sep="/"))
  if set(want) != got:
    raise ValueError(
        f"imported parameters differ from the model's: missing "
        f"{sorted(set(want) - got)}, extra {sorted(got - set(want))}"
    )
  out = {}
  for key, leaf in want.items():
    value = _pop(tree, key)
    if tuple(value.shape) != tuple(leaf.shape):
      raise ValueError(f"{key}: {value.shape} for {leaf.shape}")
    out[key] = jax.device_put(np.asarray(value, leaf.dtype), leaf.sharding)
    out[key].block_until_ready()
    del value
  return flax.traverse_util.unflatten_dict(out, sep="/")


def import_model(run: spec.Run) -> dict[str, Any]:
  """Writes the folder's model into the workdir as an export.

  Raises:
    errors.UserError: no folder named, a file missing, an unsupported
      model_type or option, a tensor missing or of another shape (one line
      each, before anything is written).
  """
  folder = _folder(run)
  hf = _read_json(folder, "config.json")
  family = registry.family_of(hf)
  text = family.text(hf)
  model = family.settings(text)
  vocab_size = int(hf_config.get(text, "vocab_size"))
  checkpoint.check_weights(folder)
  vocab = vocab_lib.TokenizerVocabulary(
      _read_text(folder, vocab_lib.FILE),
      vocab_size,
      # A nested text_config (Gemma 3 4B+) may hold the ids, or the top.
      *special_ids.read(folder, {**text, **_ids_of(hf)}),
  )
  new = _imported_run(run, model)
  dtype = np.dtype(
      blocks.compute_dtype(new.settings.model.param_dtype, "model.param_dtype")
  )
  tensors = checkpoint.open_tensors(folder)
  used: set[str] = set()
  try:
    take = registry.taker(tensors, family.prefixes, used, dtype)
    tree = family.params(dict(model, vocab_size=vocab_size), take)
  finally:
    tensors.close()
  unused = sorted(set(tensors) - used)
  if unused:
    console.info("import: %d tensors left unused: %s", len(unused), unused[:5])
  params = _params(new, vocab_size, tree)
  n = int(sum(x.size for x in jax.tree.leaves(params)))
  meta = {
      "signature": new.signature(vocab_size),
      "step": 0,
      "dtype": new.settings.model.param_dtype,
      "source": folder,
      "imported": hf["model_type"],
      "model": model,
  }
  out = paths.resolve(run.workdir)
  runfiles.write_export(out, new.config_json, vocab, params, meta)
  to_hf.keep_source(folder, out, used)  # For export.format=hf.
  line = (
      f"imported {hf['model_type']} from {folder} ({n:,} parameters, "
      f"vocabulary {vocab_size:,}) into {out}"
  )
  return {"summary_lines": [line], "results_path": out, "export": out}
