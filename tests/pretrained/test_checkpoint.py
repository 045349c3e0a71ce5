"""memjax.pretrained.checkpoint: single and sharded safetensors, bfloat16;
a folder without weights."""

import json
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors import numpy as st

from memjax import errors
from memjax.pretrained import checkpoint
from tests.conftest import REPO
from tests.conftest import run_main

GPT2 = os.path.join(REPO, "tests", "fixtures", "pretrained", "gpt2")


def test_a_sharded_checkpoint_reads_as_the_single_file(tmp_path):
  whole = st.load_file(os.path.join(GPT2, "model.safetensors"))
  names = sorted(whole)
  shards = {
      "model-00001-of-00002.safetensors": names[::2],
      "model-00002-of-00002.safetensors": names[1::2],
  }
  weight_map = {}
  for shard, part in shards.items():
    st.save_file({n: whole[n] for n in part}, str(tmp_path / shard))
    weight_map.update({n: shard for n in part})
  index = tmp_path / checkpoint.INDEX
  index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
  got = checkpoint.read_tensors(str(tmp_path))
  assert sorted(got) == names
  for n in names:
    np.testing.assert_array_equal(got[n], whole[n])
  os.remove(tmp_path / "model-00002-of-00002.safetensors")
  with pytest.raises(errors.DataError, match="names model-00002-of-00002"):
    checkpoint.read_tensors(str(tmp_path))


def test_bfloat16_tensors_are_read(tmp_path):
  x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
  data = x.astype(ml_dtypes.bfloat16).tobytes()
  # The format: an 8-byte little-endian header length, a JSON header, data.
  header = json.dumps(
      {"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, len(data)]}}
  ).encode()
  header += b" " * (-len(header) % 8)
  raw = len(header).to_bytes(8, "little") + header + data
  (tmp_path / checkpoint.SINGLE).write_bytes(raw)
  got = checkpoint.read_tensors(str(tmp_path))["w"]
  assert got.dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(got.astype(np.float32), x)


def test_a_damaged_file_is_one_error(tmp_path):
  (tmp_path / checkpoint.SINGLE).write_bytes(b"not safetensors")
  with pytest.raises(errors.DataError, match="not a readable safetensors"):
    checkpoint.read_tensors(str(tmp_path))


def _mapped(paths):
  """How many of ``paths`` this process has memory-mapped (Linux)."""
  with open("/proc/self/maps", encoding="utf-8") as f:
    maps = f.read()
  return sum(os.path.realpath(p) in maps for p in paths)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux")
def test_tensors_are_read_on_demand_one_shard_mapped_at_a_time(tmp_path):
  whole = st.load_file(os.path.join(GPT2, "model.safetensors"))
  names = sorted(whole)
  files = [str(tmp_path / f"s{i}.safetensors") for i in range(2)]
  for i, path in enumerate(files):
    st.save_file({n: whole[n] for n in names[i::2]}, path)
  weight_map = {n: os.path.basename(files[i % 2]) for i, n in enumerate(names)}
  (tmp_path / checkpoint.INDEX).write_text(
      json.dumps({"metadata": {}, "weight_map": weight_map})
  )
  tensors = checkpoint.open_tensors(str(tmp_path))
  assert sorted(tensors) == names and _mapped(files) == 0  # Headers only.
  assert tensors.shape(names[1]) == whole[names[1]].shape
  assert tensors.dtype(names[1]) == "F32"
  for n in (names[0], names[1], names[2]):  # Shards 0, 1, 0.
    got = tensors.read(n, ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, whole[n].astype(ml_dtypes.bfloat16))
    assert _mapped(files) == 1
    assert tensors.shard(n) in {p for p in files if _mapped([p])}
  np.testing.assert_array_equal(tensors.read(names[3]), whole[names[3]])
  tensors.close()
  assert _mapped(files) == 0


def test_a_folder_with_config_json_alone_is_one_line_naming_the_plan(
    tmp_path,
):
  # --mode=import through memjax.main: exit status 2, one line saying there
  # are no weights and that --mode=plan takes the folder as it is.
  shutil.copy(os.path.join(GPT2, "config.json"), tmp_path)
  r = run_main(
      "--config=configs/pretrained.py:import",
      f"--config.pretrained.path={tmp_path}",
      f"--workdir={tmp_path / 'w'}",
      "--mode=import",
  )
  assert r.returncode == 2, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("memjax: error: "), lines
  assert "no weights to import" in lines[0] and "--mode=plan" in lines[0]
  assert not (tmp_path / "w").exists()
