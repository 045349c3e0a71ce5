"""export.format=hf: imported models written back as Hugging Face folders.

Each fixture (tests/fixtures/pretrained/, saved by Hugging Face's PyTorch
classes) is imported, exported as a Hugging Face folder and imported
again: the parameters must be the first import's bit for bit, the model
must give Hugging Face's stored log-probabilities, and the files must be
the ones Hugging Face saved (the same tensors, bit for bit in float32, and
config.json). Models Hugging Face has no class for are refused in one line.
"""

import json
import os

import flax
import ml_dtypes
import numpy as np
import pytest
from safetensors import numpy as st_numpy

from configs import pretrained
import memjax
from memjax.pretrained import checkpoint
from memjax.pretrained import to_hf
from tests.pretrained import helpers
from tests.conftest import run_main

FIXTURES, NAMES = helpers.FIXTURES, helpers.TEXT_NAMES


def _import(folder: str, workdir: str) -> str:
  c = pretrained.get_config("import")
  c.pretrained.path = folder
  memjax.run_mode("import", c, workdir)
  return workdir


def _export(workdir: str, out: str, **settings) -> str:
  overrides = {"export.format": "hf", "export.dir": out}
  overrides.update({f"export.{k}": v for k, v in settings.items()})
  memjax.run_mode("export", None, workdir, overrides=overrides)
  return out


def _flat_params(workdir: str) -> dict[str, np.ndarray]:
  params = memjax.load(workdir).restored.params
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  return {k: np.asarray(v) for k, v in flat.items()}


def _log_probs(workdir: str, ids: np.ndarray) -> np.ndarray:
  return helpers.log_probs(memjax.load(workdir).restored, ids)


def _fixture_tensors(name: str) -> dict[str, np.ndarray]:
  return st_numpy.load_file(os.path.join(FIXTURES, name, "model.safetensors"))


@pytest.fixture(scope="module")
def round_trips(tmp_path_factory):
  """{fixture: (its import, the import exported as hf, that re-imported)};
  GPT-2 exported through memjax.main with --config.export.format=hf."""
  root = tmp_path_factory.mktemp("to_hf")
  out = {}
  for name in NAMES:
    first = _import(os.path.join(FIXTURES, name), str(root / name))
    folder = str(root / f"{name}_hf")
    if name == "gpt2":
      proc = run_main(
          "--config=configs/pretrained.py:import",
          "--config.export.format=hf",
          f"--config.export.dir={folder}",
          f"--workdir={first}",
          "--mode=export",
      )
      assert proc.returncode == 0, proc.stderr[-3000:]
      assert "as a Hugging Face gpt2" in proc.stdout
    else:
      _export(first, folder)
    again = _import(folder, str(root / f"{name}_again"))
    out[name] = (first, folder, again)
  return out


@pytest.mark.parametrize("name", NAMES)
def test_import_export_import_is_the_same_model(round_trips, name):
  first, _, again = round_trips[name]
  a, b = _flat_params(first), _flat_params(again)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  expected = np.load(os.path.join(FIXTURES, name, "expected.npz"))
  got = _log_probs(again, expected["input_ids"])
  want = helpers.hf_log_probs(expected)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_the_folder_holds_what_hugging_face_saved(round_trips, name):
  _, folder, _ = round_trips[name]
  assert sorted(os.listdir(folder)) == [
      "config.json",
      "generation_config.json",
      "model.safetensors",
      "tokenizer.json",
      "tokenizer_config.json",
  ]
  want, got = _fixture_tensors(name), st_numpy.load_file(
      os.path.join(folder, "model.safetensors")
  )
  assert sorted(got) == sorted(want)
  for key in want:  # float32 in, float32 out: bit for bit.
    assert got[key].dtype == want[key].dtype
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  for file in ("config.json", "generation_config.json", "tokenizer.json"):
    with open(os.path.join(folder, file), encoding="utf-8") as f:
      mine = json.load(f)
    with open(os.path.join(FIXTURES, name, file), encoding="utf-8") as f:
      assert mine == json.load(f), file


def test_a_small_shard_size_writes_shards_and_an_index(round_trips, tmp_path):
  first = round_trips["qwen2"][0]
  folder = _export(first, str(tmp_path / "sharded"), hf_shard_mb=0.02)
  with open(os.path.join(folder, checkpoint.INDEX), encoding="utf-8") as f:
    index = json.load(f)
  files = sorted(set(index["weight_map"].values()))
  assert (
      len(files) > 2
      and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
  )
  assert not os.path.exists(os.path.join(folder, checkpoint.SINGLE))
  want = _fixture_tensors("qwen2")
  assert sorted(index["weight_map"]) == sorted(want)
  got = {}
  for file in files:
    shard = st_numpy.load_file(os.path.join(folder, file))
    assert sum(a.nbytes for a in shard.values()) <= 20_000 or len(shard) == 1
    assert all(index["weight_map"][k] == file for k in shard)
    got.update(shard)
  assert {k: v.shape for k, v in got.items()} == {
      k: v.shape for k, v in want.items()
  }
  assert index["metadata"]["total_size"] == sum(a.nbytes for a in got.values())
  # The sharded folder imports as the single file does.
  again = _import(folder, str(tmp_path / "again"))
  b = _flat_params(again)
  for key, value in _flat_params(first).items():
    np.testing.assert_array_equal(value, b[key], err_msg=key)


def test_a_bfloat16_export_writes_bf16_tensors(round_trips, tmp_path):
  first = round_trips["llama3_scaled"][0]
  folder = _export(first, str(tmp_path / "bf16"), dtype="bfloat16")
  with open(os.path.join(folder, "model.safetensors"), "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
  dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
  assert dtypes == {"BF16"}
  got = checkpoint.read_tensors(folder)
  for key, value in _fixture_tensors("llama3_scaled").items():
    np.testing.assert_array_equal(
        got[key], value.astype(ml_dtypes.bfloat16), err_msg=key
    )
  with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["dtype"] == "bfloat16"


def test_an_export_of_an_import_finds_its_import(round_trips, tmp_path):
  first = round_trips["qwen2"][0]
  out = memjax.export(first, str(tmp_path / "export"))  # memjax's format
  assert not os.path.exists(os.path.join(out, to_hf.HF_DIR))
  assert to_hf.find_import(out) == first
  folder = _export(out, str(tmp_path / "hf"))
  got = st_numpy.load_file(os.path.join(folder, "model.safetensors"))
  for key, value in _fixture_tensors("qwen2").items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def _refused(workdir: str, out: str) -> str:
  """The one error line of an hf export of ``workdir`` into ``out``,
  checked to write nothing."""
  proc = run_main(
      f"--workdir={workdir}",
      "--mode=export",
      "--export_format=hf",
      f"--export_dir={out}",
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("memjax: error: "), lines
  assert not os.path.exists(out) and not os.path.exists(out + ".partial")
  return lines[0]


def test_a_model_not_imported_is_refused(smoke_workdir, tmp_path):
  line = _refused(smoke_workdir, str(tmp_path / "hf"))
  assert "holds no imported model" in line


def _train(source: str, workdir: str, variant: str, *flags: str) -> str:
  proc = run_main(
      f"--config=configs/pretrained.py:{variant}",
      f"--config.train.init_from={source}",
      "--config.train.num_steps=2",
      "--config.train.log_every=1",
      "--config.train.eval_every=0",
      "--config.optim.warmup_steps=1",
      "--config.data.seq_len=32",
      "--config.data.batch_size=2",
      "--config.eval.max_windows=1",
      "--config.eval.splits=('valid',)",
      f"--workdir={workdir}",
      *flags,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


def test_a_product_key_memory_is_refused(round_trips, tmp_path):
  workdir = _train(
      round_trips["llama_gqa"][0],
      str(tmp_path / "pkm"),
      "llama_pkm",
      "--config.model.feed_forward_options.num_keys=8",
      "--config.model.feed_forward_options.topk=4",
      "--config.model.feed_forward_options.k_dim=16",
  )
  line = _refused(workdir, str(tmp_path / "hf"))
  assert "is not the llama of" in line and "feed_forward='resm'" in line
  assert "Hugging Face has no class for it" in line


def test_a_model_trained_from_an_import_exports(round_trips, tmp_path):
  source = round_trips["llama_gqa"][0]
  workdir = _train(
      source,
      str(tmp_path / "trime"),
      "gpt2_trime",
      "--config.data.segments_per_lane=2",
  )
  folder = _export(workdir, str(tmp_path / "hf"))
  again = _import(folder, str(tmp_path / "again"))
  trained, back = _flat_params(workdir), _flat_params(again)
  assert sorted(trained) == sorted(back)
  for key in trained:
    np.testing.assert_array_equal(trained[key], back[key], err_msg=key)
  # Training moved the weights away from the checkpoint's.
  got = st_numpy.load_file(os.path.join(folder, "model.safetensors"))
  want = _fixture_tensors("llama_gqa")
  assert sorted(got) == sorted(want)
  assert any(not np.array_equal(got[k], want[k]) for k in want)
  assert to_hf.find_import(workdir) == source


def _toy_params(m, take):
  """A family's params function in miniature: a transpose, a split and
  a reshape."""
  w = take("w", (2, 3))
  b = take("b", (4,))
  return {"k": w.T, "lo": b[:2], "hi": {"x": b[2:].reshape(1, 2)}}


def test_the_probe_says_where_each_element_comes_from():
  positions, records, total = to_hf.probe(_toy_params, {})
  assert records == {"w": (0, (2, 3)), "b": (6, (4,))} and total == 10
  np.testing.assert_array_equal(positions["k"], [[0, 3], [1, 4], [2, 5]])
  np.testing.assert_array_equal(positions["lo"], [6, 7])
  np.testing.assert_array_equal(positions["hi/x"], [[8, 9]])
  values = {
      "k": np.array([[1, 4], [2, 5], [3, 6]], np.float32),
      "lo": np.array([7, 8], np.float32),
      "hi/x": np.array([[9, 10]], np.float32),
  }
  got = to_hf.checkpoint_arrays(values, positions, records, total, np.float32)
  np.testing.assert_array_equal(got["w"], [[1, 2, 3], [4, 5, 6]])
  np.testing.assert_array_equal(got["b"], [7, 8, 9, 10])
  # Positions past the dtype's range: probed again in int64.
  big, _, n = to_hf.probe(
      lambda m, take: {"a": take("a", (300,))}, {}, np.uint8
  )
  assert big["a"].dtype == np.int64 and n == 300 and big["a"][-1] == 299


def test_an_element_written_twice_or_never_is_a_bug():
  def twice(m, take):
    b = take("b", (4,))
    return {"a": b[:3], "c": b[2:]}

  positions, records, total = to_hf.probe(twice, {})
  values = {k: np.zeros(v.shape, np.float32) for k, v in positions.items()}
  with pytest.raises(ValueError, match="not once"):
    to_hf.checkpoint_arrays(values, positions, records, total, np.float32)

  def computed(m, take):
    return {"a": take("b", (2,)) * 0.5}

  positions, records, total = to_hf.probe(computed, {})
  with pytest.raises(ValueError, match="computed"):
    to_hf.checkpoint_arrays(
        {"a": np.zeros(2)}, positions, records, total, np.float32
    )


def test_checkpoint_names_are_the_imports():
  taken = ("wte.weight", "lm_head.weight", "h.0.w")
  # Without the import's list: the prefix, but lm_head at the top.
  assert to_hf.checkpoint_names(taken, ("transformer.",), None) == {
      "wte.weight": "transformer.wte.weight",
      "lm_head.weight": "lm_head.weight",
      "h.0.w": "transformer.h.0.w",
  }
  stored = ["transformer.lm_head.weight", "wte.weight", "transformer.h.0.w"]
  assert to_hf.checkpoint_names(taken, ("transformer.",), stored) == {
      "wte.weight": "wte.weight",
      "lm_head.weight": "transformer.lm_head.weight",
      "h.0.w": "transformer.h.0.w",
  }


def test_a_multimodal_import_exports_its_language_model(tmp_path):
  """gemma3 (Gemma3ForConditionalGeneration): the import reads the
  language model only, and the export writes it as a gemma3_text
  (Gemma3ForCausalLM) folder, which imports to the same model."""
  first = _import(os.path.join(FIXTURES, "gemma3"), str(tmp_path / "first"))
  folder = _export(first, str(tmp_path / "hf"))
  with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  assert config["model_type"] == "gemma3_text"
  assert config["architectures"] == ["Gemma3ForCausalLM"]
  names = st_numpy.load_file(os.path.join(folder, "model.safetensors"))
  want = {
      k[len("language_model.") :]: v
      for k, v in _fixture_tensors("gemma3").items()
      if k.startswith("language_model.")
  }
  assert sorted(names) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(names[key], want[key], err_msg=key)
  again = _import(folder, str(tmp_path / "again"))
  a, b = _flat_params(first), _flat_params(again)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  expected = np.load(os.path.join(FIXTURES, "gemma3", "expected.npz"))
  got = _log_probs(again, expected["input_ids"])
  want_lp = helpers.hf_log_probs(expected)
  np.testing.assert_allclose(got, want_lp, atol=1e-5, rtol=0)
