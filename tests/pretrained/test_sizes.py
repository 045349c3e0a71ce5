"""A config given for an imported model takes its sizes (pretrained.sizes);
a plan takes them from a folder's config.json alone."""

import json
import os

import pytest

from memjax import errors
from memjax.pretrained import sizes


def _export(tmp_path, model):
  path = tmp_path / "import"
  path.mkdir()
  (path / "export.json").write_text(
      json.dumps({"imported": "llama", "model": model})
  )
  return str(path)


MODEL = {
    "num_layers": 4,
    "d_model": 32,
    "max_len": 64,
    "dropout": 0.0,
    "feed_forward": "glu",
    "feed_forward_options": {},
    "feed_forward_layers": [],
}


def _tree(**model):
  return {
      "model": dict(
          {
              "num_layers": 2,
              "d_model": 8,
              "dropout": 0.1,
              "feed_forward": "ffn",
              "feed_forward_options": {},
              "feed_forward_layers": [],
          },
          **model,
      ),
      "eval": {"window_len": 512, "score_len": 256},
      "data": {"seq_len": 128, "tokenizer": ""},
      "train": {"init_from": ""},
  }


def test_the_imports_sizes_and_tokenizer_the_configs_dropout(tmp_path):
  source = _export(tmp_path, MODEL)
  tree = _tree()
  tree["train"]["init_from"] = source
  assert sizes.apply(tree, str(tmp_path / "new"))
  m = tree["model"]
  assert (m["num_layers"], m["d_model"], m["feed_forward"]) == (4, 32, "glu")
  assert m["dropout"] == 0.1  # The config's (CONFIG_KEYS).
  assert tree["eval"] == {"window_len": 64, "score_len": 32}
  assert tree["data"] == {"seq_len": 64, "tokenizer": os.path.realpath(source)}
  # In the import's own workdir its tokenizer is the run's: none named.
  tree = _tree()
  assert sizes.apply(tree, source) and tree["data"]["tokenizer"] == ""
  # Neither is an import: unchanged.
  tree, before = _tree(), json.dumps(_tree())
  assert not sizes.apply(tree, str(tmp_path)) and json.dumps(tree) == before


def test_an_inserted_feed_forward_keeps_the_imports_kind_elsewhere(tmp_path):
  source = _export(tmp_path, MODEL)
  tree = _tree(
      feed_forward="resm",
      feed_forward_layers=[-2, 1],
      feed_forward_options={"num_keys": 8},
  )
  tree["train"]["init_from"] = source
  assert sizes.apply(tree, str(tmp_path / "new"))
  m = tree["model"]
  assert m["feed_forward"] == "resm" and m["feed_forward_layers"] == [3, 1]
  assert m["feed_forward_options"] == {"num_keys": 8, "base": "glu"}


def test_a_plan_takes_the_sizes_of_a_config_json_alone(tmp_path):
  # A folder with config.json only: its model settings (families.py's
  # reading, the same the import makes) and its vocabulary for the plan.
  hf = {
      "model_type": "llama",
      "hidden_size": 32,
      "num_attention_heads": 4,
      "num_key_value_heads": 2,
      "num_hidden_layers": 3,
      "intermediate_size": 48,
      "max_position_embeddings": 64,
      "vocab_size": 80,
  }
  (tmp_path / "config.json").write_text(json.dumps(hf))
  tree = dict(_tree(), pretrained={"path": str(tmp_path)}, plan={})
  tree["plan"]["vocab_size"] = 0
  assert sizes.apply_folder(tree, str(tmp_path / "plan"))
  m = tree["model"]
  assert (m["num_layers"], m["d_model"], m["d_ff"]) == (3, 32, 48)
  assert m["attention_options"]["num_kv_heads"] == 2
  assert m["dropout"] == 0.1  # The config's (CONFIG_KEYS).
  assert tree["plan"]["vocab_size"] == 80
  assert tree["eval"] == {"window_len": 64, "score_len": 32}
  # A vocabulary the config sets is kept; the sizes are config.json's.
  tree = dict(_tree(), pretrained={"path": str(tmp_path)}, plan={})
  tree["plan"]["vocab_size"] = 96
  assert sizes.apply_folder(tree, str(tmp_path / "plan"))
  assert tree["plan"]["vocab_size"] == 96
  assert tree["model"]["num_layers"] == 3
  # No folder named: unchanged. A folder without config.json: one line.
  tree, before = dict(_tree(), plan={}), json.dumps(dict(_tree(), plan={}))
  assert not sizes.apply_folder(tree, str(tmp_path / "plan"))
  assert json.dumps(tree) == before
  empty = tmp_path / "empty"
  empty.mkdir()
  tree = dict(_tree(), pretrained={"path": str(empty)}, plan={})
  with pytest.raises(errors.DataError, match="has no config.json"):
    sizes.apply_folder(tree, str(tmp_path / "plan"))
