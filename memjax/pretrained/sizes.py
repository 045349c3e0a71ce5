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
"""

from __future__ import annotations

from typing import Any, Optional

from memjax import settings as settings_lib
from memjax.checkpoints import convert
from memjax.checkpoints import runfiles
from memjax.io import paths

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


def apply(tree: dict[str, Any], workdir: str) -> bool:
  """Sets in a config's tree (its JSON form) the model settings of the
  imported export in ``workdir`` or ``train.init_from``; False (``tree``
  unchanged) when neither holds one."""
  source = workdir
  model = imported_model(workdir)
  if model is None:
    source = str(tree.get("train", {}).get("init_from", ""))
    model = imported_model(paths.resolve(source) if source else "")
  if model is None:
    return False
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
  if source != workdir and not tree["data"].get("tokenizer"):
    tree["data"]["tokenizer"] = paths.resolve(source)
  return True
