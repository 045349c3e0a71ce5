"""The demos' shared helper: table files, reading back finished rows and
stages, row selection, and config files found and loaded by path (no
training: the trainer is replaced where a row would train)."""

import ast
import json
import os
import pathlib
import shutil

import pytest

from memjax import errors
from memjax.demos import common

REPO = pathlib.Path(__file__).resolve().parents[2]


def _write(path, obj):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj))


def test_markdown_aligns_and_leaves_blank_cells_blank():
  table = common.markdown(
      ["model", "ppl", "layer"], "lrl", [["a", "1.00", "2"], ["", "", "3"]]
  )
  assert table.splitlines() == [
      "| model | ppl | layer |",
      "|---|---:|---|",
      "| a | 1.00 | 2 |",
      "| | | 3 |",
  ]


def test_unigram_and_tokens_cells():
  rows = [{"unigram": {"valid": {"ppl": 524.594}, "test": {"ppl": 476.4}}}]
  assert common.unigram(rows, "ppl") == ["524.59", "476.40"]
  assert common.tokens_per_s({"train_tokens_per_s": 4059.6}) == "4060"
  assert common.tokens_per_s({}) == "-"  # a run read back from an earlier demo


def test_finish_writes_table_json_and_md_and_prints(
    tmp_path, monkeypatch, capsys
):
  monkeypatch.setattr(common, "machine", lambda: "x86_64, 2 CPU cores, cpu")
  demo = common.Demo(str(tmp_path / "out"))
  rows = [{"row": "vanilla", "ppl": (1.5, 2.5)}]
  out = demo.finish({"rows": rows}, "| a |\n|---|", "Demo corpus", "1 rows")
  table = json.loads((tmp_path / "out" / "table.json").read_text())
  assert table == out
  assert table["rows"] == [{"row": "vanilla", "ppl": [1.5, 2.5]}]
  assert table["machine"] == "x86_64, 2 CPU cores, cpu"
  assert table["markdown"] == "| a |\n|---|"
  assert 0 <= table["seconds"] < 60
  assert (tmp_path / "out" / "table.md").read_text() == "| a |\n|---|\n"
  printed = capsys.readouterr().out.splitlines()
  assert printed[1] == "Demo corpus (1 rows, 0s on x86_64, 2 CPU cores, cpu):"
  assert printed[2:4] == ["| a |", "|---|"]
  assert printed[-1] == f"written: {tmp_path / 'out' / 'table.md'}"


def test_select_keeps_declared_order_and_names_unknown_rows():
  rows = [common.Row("vanilla", "v"), common.Row("pkm", "p")]
  assert common.select(rows, None) == rows
  assert [r.key for r in common.select(rows, ["pkm", "vanilla"])] == [
      "vanilla",
      "pkm",
  ]
  with pytest.raises(
      errors.ConfigError, match=r"unknown --rows \['rnn'\]"
  ) as e:
    common.select(rows, ["pkm", "rnn"])
  assert "'vanilla', 'pkm'" in str(e.value) and "\n" not in str(e.value)


def test_row_directories():
  assert (
      common.slug("vanilla + continuous cache") == "vanilla___continuous_cache"
  )
  assert common.Row("TRIMELM_long", "x").dirname == "trimelm_long"
  demo = common.Demo("/tmp/unused_demo_dir_test_common")
  assert demo.run_dir("f_fresh") == "/tmp/unused_demo_dir_test_common/f_fresh"
  os.rmdir("/tmp/unused_demo_dir_test_common")


class _Config:
  """Just what ``common.train`` reads of a config."""

  class train:  # pylint: disable=invalid-name
    num_steps = 30


def test_train_reads_back_a_run_finished_with_the_same_steps(
    tmp_path, monkeypatch
):
  from memjax import api  # pylint: disable=g-import-not-at-top

  calls = []

  def fake_train(config, workdir):
    calls.append(workdir)
    os.makedirs(workdir, exist_ok=True)  # as the trainer makes it
    return {"step": config.train.num_steps, "valid": {"ppl": 9.0}}

  monkeypatch.setattr(api, "train", fake_train)
  run = tmp_path / "vanilla"
  assert common.finished(str(run), 30) is None  # nothing there: train
  res = common.train(_Config, str(run))
  assert calls == [str(run)] and res["valid"] == {"ppl": 9.0}
  saved = json.loads((run / "results.json").read_text())
  assert saved["step"] == 30 and saved["wall_s"] >= 0
  # Run again (an interrupted demo continued): read back, not trained.
  assert common.train(_Config, str(run)) == saved
  assert len(calls) == 1
  # A run of other steps, or an unreadable results.json, is not reused.
  _write(run / "results.json", {"step": 20, "valid": {"ppl": 1.0}})
  assert common.finished(str(run), 30) is None
  (run / "results.json").write_text("{not json")
  assert common.finished(str(run), 30) is None
  common.train(_Config, str(run))
  assert len(calls) == 2


def test_once_and_stages_run_a_stage_once(tmp_path):
  made = []

  def make():
    made.append(1)
    return {"keys": 5, "dims": (2, 3), "summary_lines": ["built"]}

  stages = common.Stages(str(tmp_path / "run"))
  first = stages("datastore", make)
  assert first == {"keys": 5, "dims": [2, 3]}  # as read back from JSON
  assert stages("datastore", make) == first and len(made) == 1
  assert set(stages.times) == {"datastore"}
  # A stage that writes its own file (a mode's output) keeps that file.
  own = tmp_path / "run" / "position_loss.json"

  def writes_itself():
    _write(own, {"test": {"buckets": []}})
    return {"test": {"buckets": []}, "files": ["a.png"]}

  assert common.once(str(own), writes_itself) == {"test": {"buckets": []}}


def test_configs_dir_prefers_the_installed_copy(tmp_path):
  assert common.configs_dir() == str(REPO / "configs")  # this checkout
  checkout = tmp_path / "checkout"
  (checkout / "memjax").mkdir(parents=True)
  (checkout / "configs").mkdir()
  assert common.configs_dir(str(checkout / "memjax")) == str(
      checkout / "configs"
  )
  (checkout / "memjax" / "configs").mkdir()  # as pip installs it
  assert common.configs_dir(str(checkout / "memjax")) == str(
      checkout / "memjax" / "configs"
  )
  with pytest.raises(errors.ConfigError, match="no config files in"):
    common.configs_dir(str(tmp_path / "elsewhere" / "memjax"))


def test_config_files_load_by_path_with_their_siblings(tmp_path):
  # A copy of the config files where `configs` is no importable package
  # name: each file, and the siblings it builds on, load by path.
  copy = tmp_path / "memjax_configs"
  shutil.copytree(REPO / "configs", copy)
  (copy / "__init__.py").unlink()
  enwik8 = common.load_config_file(str(copy / "trime_enwik8.py"))
  assert enwik8.trime_wt103.__file__ == str(copy / "trime_wt103.py")
  assert enwik8.get_config("smoke").data.corpus == "enwik8"
  for name, sibling in (
      ("pkm_wt103", "trime_wt103"),
      ("lamemo_wt103", "txl_wt103"),
  ):
    module = common.load_config_file(str(copy / f"{name}.py"))
    assert getattr(module, sibling).__file__ == str(copy / f"{sibling}.py")
  with pytest.raises(errors.ConfigError, match="no config file"):
    common.load_config_file(str(copy / "nope.py"))


def test_load_config_matches_the_config_file():
  from configs import trime_wt103  # pylint: disable=g-import-not-at-top

  loaded = common.load_config("trime_wt103", "trime_demo")
  assert loaded.to_dict() == trime_wt103.get_config("trime_demo").to_dict()
  assert loaded is not common.load_config("trime_wt103", "trime_demo")


def _imports(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
  return names


def test_no_module_imports_configs_by_name():
  """The library and the demos load config files by path; the library does
  not import the demos."""
  for path in (REPO / "memjax").rglob("*.py"):
    names = _imports(path)
    assert not any(
        n == "configs" or n.startswith("configs.") for n in names
    ), path
    if "demos" not in path.parts:
      assert not any(n.startswith("memjax.demos") for n in names), path
  for path in (REPO / "configs").glob("*.py"):
    assert not any(n.startswith("configs") for n in _imports(path)), path
