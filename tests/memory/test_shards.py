"""The build steps every datastore shares: which shards a process writes,
its share of the build, and the join of complete shards into a manifest."""

import json
import os

import numpy as np
import pytest

from memjax import errors
from memjax.memory import datastore as ds_lib
from memjax.memory import shards


def _mark_written(path, *done):
  os.makedirs(path, exist_ok=True)
  for s in done:
    with open(os.path.join(path, f"shard-{s:05d}.json"), "w") as f:
      f.write("{}")


@pytest.mark.parametrize(
    "k, n, done, want",
    [
        (0, 1, (), [0, 1, 2, 3, 4, 5, 6]),
        (0, 1, (2, 5), [0, 1, 3, 4, 6]),
        (0, 3, (), [0, 3, 6]),
        (0, 3, (3,), [0, 6]),
        (1, 3, (4,), [1]),
        (2, 3, (1, 2, 5), []),
        (6, 7, (0,), [6]),
    ],
)
def test_to_write_is_k_of_n_less_the_written(tmp_path, k, n, done, want):
  path = str(tmp_path / "ds")
  _mark_written(path, *done)
  assert shards.to_write(path, 7, k, n) == want


def test_process_share_falls_back_to_jax_and_refuses_k_outside_n():
  # One CPU process: jax.process_index() is 0 of jax.process_count() 1.
  assert shards.process_share(-1, 0, "datastore") == (0, 1)
  assert shards.process_share(None, None, "datastore") == (0, 1)
  assert shards.process_share(2, 3, "datastore") == (2, 3)
  assert shards.process_share(-1, 4, "datastore") == (0, 4)
  for k, n in ((3, 3), (5, 0), (7, 2)):
    with pytest.raises(errors.ConfigError) as e:
      shards.process_share(k, n, "mt_memory")
    msg = str(e.value)
    assert "\n" not in msg
    assert f"mt_memory.process_index={k} must be in" in msg
    assert f"mt_memory.process_count={max(n, 1)})" in msg


def test_two_shares_write_their_shards_and_the_second_joins(tmp_path):
  # 3 shards of one batch each; batch b holds keys b * 10 + [0, 1, 2] with
  # values 100 + the same; position -1 (the middle pair) is not stored.
  path = str(tmp_path / "ds")

  def batches(s):
    g = (s * 10 + np.arange(3, dtype=np.float32))[:, None] * np.ones((1, 2))
    yield {
        "g": g,
        "v": 100 + s * 10 + np.arange(3),
        "pos": [3 * s, -1, 3 * s + 2],
    }

  features = lambda b: (b["g"], b["v"], np.asarray(b["pos"]))
  meta = dict(
      signature={"model": {}},
      dim=2,
      corpus="c",
      split="train",
      context={},
      checkpoint=None,
  )
  assert shards.write(path, {"a": 1}, 3, (1, 2), features, batches, 2)
  assert sorted(os.listdir(path)) == [
      "build.json",
      "shard-00001.json",
      "shard-00001.keys",
      "shard-00001.values",
  ]
  assert not shards.join(path, 3, **meta)
  assert not os.path.exists(os.path.join(path, "manifest.json"))
  # build.json is written once: a second share keeps the first's.
  assert shards.write(path, {"a": 2}, 3, (0, 2), features, batches, 2)
  assert json.load(open(os.path.join(path, "build.json"))) == {"a": 1}
  assert shards.join(path, 3, **meta)
  store = ds_lib.open_datastore(path)
  assert [e["first_position"] for e in store.manifest["shards"]] == [0, 3, 6]
  keys, vals = store.gather(np.arange(store.count))
  np.testing.assert_array_equal(vals, [100, 102, 110, 112, 120, 122])
  np.testing.assert_array_equal(keys[:, 0], [0, 2, 10, 12, 20, 22])


def test_a_stopped_share_writes_no_more_shards(tmp_path):
  path = str(tmp_path / "ds")
  batches = lambda s: [{"g": np.ones((1, 2)), "pos": np.array([s])}]
  features = lambda b: (b["g"], b["pos"], b["pos"])
  assert not shards.write(
      path, {}, 5, (0, 1), features, batches, 2, stop_after_shards=2
  )
  assert shards.to_write(path, 5, 0, 1) == [2, 3, 4]
