"""Keys that moved read at their new place: config files, command lines and
saved runs (``memjax.settings.translate_tree``)."""

import json
import os

import ml_collections

from memjax import build
from memjax import config as config_lib
from memjax.methods.external import config as ext_config
from memjax.methods.marge import config as marge_config
from memjax.methods.trime import config as trime_config
from memjax import settings as settings_lib
from tests.conftest import REPO
from tests.conftest import run_main

FAMILIES = os.path.join(REPO, "tests", "fixtures", "families")
TABLE = {"loss.memory": "trime.memory", "data.marge": "marge"}


def test_a_moved_key_and_the_keys_below_a_moved_dict_are_renamed():
  assert settings_lib.new_key("loss.memory", TABLE) == "trime.memory"
  assert settings_lib.new_key("data.marge.search", TABLE) == "marge.search"
  assert settings_lib.new_key("loss.name", TABLE) is None
  assert settings_lib.new_key("loss.memory_x", TABLE) is None  # not below it


def test_a_tree_moves_values_over_the_new_sections_defaults(capsys):
  tree = {
      "loss": {"name": "trime", "memory": "long"},
      "data": {"seq_len": 8, "marge": {"search": "scann"}},
      "trime": {"memory": "local", "block_size": 4},
      "marge": {"search": "exact", "sub_batch": 4},
  }
  got = settings_lib.translate_tree(tree, TABLE)
  assert got == {
      "loss": {"name": "trime"},
      "data": {"seq_len": 8},
      "trime": {"memory": "long", "block_size": 4},
      "marge": {"search": "scann", "sub_batch": 4},
  }
  assert tree["loss"]["memory"] == "long"  # the input is left as it was
  assert capsys.readouterr().err == ""  # a saved run is read silently


def test_a_command_line_is_rewritten_before_it_is_parsed(capsys, monkeypatch):
  monkeypatch.setattr(
      settings_lib, "_NOTED", set()
  )  # each named once a process
  argv = [
      "prog",
      "--config=c.py:smoke",
      "--config.loss.memory=long",
      "--config.data.marge.search=scann",
      "--config.loss.name=trime",
      "--mode=train",
  ]
  assert settings_lib.translate_argv(argv, TABLE) == [
      "prog",
      "--config=c.py:smoke",
      "--config.trime.memory=long",
      "--config.marge.search=scann",
      "--config.loss.name=trime",
      "--mode=train",
  ]
  err = capsys.readouterr().err.splitlines()
  assert err == [
      "memjax: note: config key loss.memory moved to trime.memory; read there",
      "memjax: note: config key data.marge.search moved to marge.search; "
      "read there",
  ]


def test_memjax_main_takes_old_keys_on_the_command_line_with_a_notice():
  # ml_collections refuses a key its config lacks: the overrides parse only
  # once they are rewritten to the new keys.
  out = run_main(
      "--config=configs/trime_wt103.py:smoke",
      "--config.loss.memory=long",
      "--config.eval_memory.cache_lambda=0.3",
      "--mode=list",
  )
  assert out.returncode == 0, out.stderr
  assert "loss.memory moved to trime.memory" in out.stderr
  assert "eval_memory.cache_lambda moved to cache.cache_lambda" in out.stderr
  bad = run_main(
      "--config=configs/trime_wt103.py:smoke",
      "--config.loss.nothing=1",
      "--mode=list",
  )
  assert bad.returncode == 2 and "nothing" in bad.stderr


def test_a_config_file_written_with_old_keys_builds_the_same_settings():
  old = config_lib.base_config()
  old.loss.name = "trime"
  old.loss.memory = "long"  # an unlocked ConfigDict takes the old key
  old.data.bm25_k = 7
  old.eval_memory.temperature = 1.25
  old.translation.memory = ml_collections.ConfigDict({"k": 8})
  new = config_lib.base_config()
  new.loss.name = "trime"
  new.trime.memory, new.trime.bm25_k, new.trime.temperature = "long", 7, 1.25
  new.mt_memory.k = 8
  parts = build.parts()
  assert build.read(old, parts) == build.read(new, parts)
  got = build.read(old, parts)
  assert got.of(trime_config.Trime).memory == "long"
  assert got.of(ext_config.MtMemory).k == 8


def test_saved_runs_of_every_family_read_their_old_keys():
  parts = build.parts()
  for family in sorted(os.listdir(FAMILIES)):
    path = os.path.join(FAMILIES, family, "run", "config.json")
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
    s = build.read(config_lib.from_json(json.dumps(saved)), parts)
    trime = s.of(trime_config.Trime)
    assert trime.memory == saved["loss"]["memory"], family
    assert trime.lm_warmup_fraction == saved["loss"]["lm_warmup_fraction"]
    assert trime.temperature == saved["eval_memory"]["temperature"]
    if "marge" in saved["data"]:
      marge = s.of(marge_config.Marge)
      assert marge.same_doc_steps == saved["data"]["marge"]["same_doc_steps"]
      assert marge.same_doc_steps == 2  # not the default: it was read
