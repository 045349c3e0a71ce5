"""An imported model's sizes and options in the configs that run it.

A config of ``configs/pretrained.py`` names what is done with a model
(kNN-LM, TRIME training, a product-key memory), not its sizes. Where a
config is given for a workdir that holds an imported export, or whose
``train.init_from`` names one, ``apply`` sets in it the model settings
the import read from the checkpoint's ``config.json`` (export.json's
``model``; not the dropouts and the other ``CONFIG_KEYS``; a feed-forward
the config inserts at chosen layers stays, ``_inserted``), fits the segment and window lengths to the model's positions
and, for a run trained from the export, reads raw-text corpora through
its tokenizer (``data.tokenizer``). Every other setting is the config's.

A mode that needs the model's shape and not its weights (``--mode=plan``)
also takes it from a folder holding a ``config.json`` alone
(``config.pretrained.path``; ``apply_folder``), read by the import's own
functions (``families``): a model is planned before its weights are
downloaded. The vocabulary size is config.json's (``plan.vocab_size``, as
it is the import's signature's for a plan of an import).
"""

from __future__ import annotations

from typing import Any, Optional

from memjax import errors
from memjax import settings as settings_lib
from memjax.checkpoints import convert
from memjax.checkpoints import runfiles
from memjax.io import paths
from memjax.pretrained import hf_config
from memjax.pretrained import registry

# Model settings a config keeps over the import's: how it is trained, not
# what the checkpoint is.
CONFIG_KEYS = (
    "dropout",
    "adaptive_dropout",
    "attention_dropout",
    "mem_len",
    "remat",
    "remat_policy",
    "scan_layers",
)


def imported_model(directory: str) -> Optional[dict[str, Any]]:
  """The model settings an imported export in ``directory`` was made
  with, or None when it holds none."""
  if not directory:
    return None
  path = paths.join(directory, runfiles.EXPORT_FILE)
  if not paths.isfile(path):
    return None
  meta = paths.read_json(path)
  if "imported" not in meta:
    return None
  if "model" in meta:
    return dict(meta["model"])
  saved = paths.read_json(paths.join(directory, runfiles.CONFIG_FILE))
  return dict(saved["model"])


def fitted(
    model: dict[str, Any], window: int, score: int, seq_len: int
) -> dict[str, dict[str, int]]:
  """The eval and data lengths cut to the model's positions (max_len)."""
  max_len = int(model["max_len"])
  w = min(int(window), max_len)
  return {
      "eval": {"window_len": w, "score_len": min(int(score), max(1, w // 2))},
      "data": {"seq_len": min(int(seq_len), max_len)},
  }


def _inserted(config: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
  """The feed-forward a config inserts at chosen layers of the imported
  model (a product-key memory), or {}: its kind and options at
  ``feed_forward_layers`` (a negative number counts from the end: -1 is the
  last layer), the import's kind at the other layers
  (``feed_forward_options.base``)."""
  layers = list(config.get("feed_forward_layers") or ())
  if not layers:
    return {}
  n = int(model["num_layers"])
  options = dict(model.get("feed_forward_options") or {})
  # The config's options, less those it holds at its kind's defaults (filled
  # in) where the import sets them (GPT-2's activation_dropout).
  defaults = convert.kind_defaults("feed_forward", config["feed_forward"])
  for k, v in (config.get("feed_forward_options") or {}).items():
    if k not in options or not defaults or defaults.get(k, v) != v:
      options[k] = v
  options["base"] = model["feed_forward"]
  return {
      "feed_forward": config["feed_forward"],
      "feed_forward_options": options,
      "feed_forward_layers": list(
          settings_lib.layers_from_the_start(layers, n)
      ),
  }


def imported_vocab_size(directory: str) -> int:
  """The vocabulary size of the imported export in ``directory`` (its
  signature's), 0 when it records none."""
  meta = paths.read_json(paths.join(directory, runfiles.EXPORT_FILE))
  return int(meta.get("signature", {}).get("model", {}).get("vocab_size", 0))


def folder_model(folder: str) -> tuple[dict[str, Any], int]:
  """(model settings, vocabulary size) of a Hugging Face folder's
  ``config.json`` alone, as ``--mode=import`` reads them (``registry``).

  Raises:
    errors.DataError: no folder or no config.json, a config.json that is
      not JSON, or a model_type or option memjax does not take.
  """
  path = paths.join(folder, "config.json")
  if not paths.isfile(path):
    raise errors.DataError(
        f"config.pretrained.path {folder} has no config.json: a plan reads "
        "the model's sizes from it (docs/pretrained.md)"
    )
  try:
    hf = paths.read_json(path)
  except ValueError as e:
    raise errors.DataError(f"{path} is not JSON ({e})") from None
  family = registry.family_of(hf)
  text = family.text(hf)
  return family.settings(text), int(hf_config.get(text, "vocab_size"))


def _planned_vocab(tree: dict[str, Any], vocab_size: int) -> None:
  """Sets ``plan.vocab_size`` to ``vocab_size`` where the config leaves it
  0 (the model's own)."""
  plan = tree.get("plan")
  if vocab_size and plan is not None and not int(plan.get("vocab_size", 0)):
    plan["vocab_size"] = int(vocab_size)


def _source(tree: dict[str, Any], workdir: str) -> str:
  """The imported export the config is given for: ``workdir``, else
  ``train.init_from`` (resolved); '' when neither holds one."""
  if imported_model(workdir) is not None:
    return workdir
  source = str(tree.get("train", {}).get("init_from", ""))
  source = paths.resolve(source) if source else ""
  return source if imported_model(source) is not None else ""


def apply(tree: dict[str, Any], workdir: str) -> bool:
  """Sets in a config's tree (its JSON form) the model settings of the
  imported export in ``workdir`` or ``train.init_from``; False (``tree``
  unchanged) when neither holds one."""
  source = _source(tree, workdir)
  if not source:
    return False
  _set_model(tree, imported_model(source))
  if source != workdir and not tree["data"].get("tokenizer"):
    tree["data"]["tokenizer"] = source
  return True


def apply_folder(tree: dict[str, Any], workdir: str) -> bool:
  """For a mode that needs the model's shape and not its weights
  (``--mode=plan``): ``apply``, else the model settings of the folder
  ``pretrained.path`` names, from its ``config.json`` alone; and the
  vocabulary size (``plan.vocab_size``, where the config leaves it 0) of
  the import or of that config.json. False (``tree`` unchanged) when the
  config names neither.

  Raises:
    errors.DataError: see ``folder_model``.
  """
  source = _source(tree, workdir)
  if source:
    apply(tree, workdir)
    _planned_vocab(tree, imported_vocab_size(source))
    return True
  folder = str(tree.get("pretrained", {}).get("path", ""))
  if not folder:
    return False
  model, vocab_size = folder_model(paths.resolve(folder))
  _set_model(tree, model)
  _planned_vocab(tree, vocab_size)
  return True


def _set_model(tree: dict[str, Any], model: dict[str, Any]) -> None:
  """The import's model settings in the config's tree, with the
  feed-forward it inserts and the lengths fitted to its positions."""
  inserted = _inserted(tree["model"], model)
  tree["model"].update({k: v for k, v in model.items() if k not in CONFIG_KEYS})
  tree["model"].update(inserted)
  for section, values in fitted(
      model,
      tree["eval"]["window_len"],
      tree["eval"]["score_len"],
      tree["data"]["seq_len"],
  ).items():
    tree[section].update(values)
