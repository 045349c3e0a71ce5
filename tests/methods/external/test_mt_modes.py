"""The MT datastore over the smoke run: value j is the training target token
at position j, tuning reads it, and a datastore of another model or another
vocabulary is refused with one line before anything is written."""

import json
import os
import shutil

import numpy as np
import pytest

import memjax

from memjax import build

from memjax import dispatch
from memjax import errors
from memjax.checkpoints import runfiles
from memjax.data import parallel
from memjax.memory import search as search_lib
from memjax.methods.external import mt_datastore
from memjax.methods.external import mt_modes as tm
from memjax.tasks import config as task_config
from memjax.tasks.translation import parts
from tests.methods.external.test_memory_decoding import numpy_target_prob

SHOWN = "Das Haus ist groß."
# A second one: the sentences are searched together, so each must
# get its own translation's positions back.
SHOWN_2 = "Öffnen Sie die Datei."


@pytest.fixture(scope="module")
def built(mt_smoke_workdir, tmp_path_factory):
  out = tmp_path_factory.mktemp("mt_memory_modes")
  config = dispatch.saved_config(mt_smoke_workdir)
  with config.unlocked():
    config.train.init_from = mt_smoke_workdir
    mem = config.mt_memory
    mem.datastore = str(out / "ds")
    mem.search, mem.k, mem.k_grid = "exact", 4, (1, 4)
    # The smoke model's 4 nearest squared distances lie within a few units
    # of each other: temperatures of that order weigh them apart (at 10 and
    # 100 the weights are nearly uniform and the NLLs differ by < 1e-4).
    mem.knn_lambda_grid, mem.knn_temperature_grid = (0.2,), (1.0, 10.0)
    mem.tune_sentences = 8
    mem.show_sentences = (SHOWN, SHOWN_2)
  result = memjax.run_mode("mt_datastore", config, str(out))
  return config, out, result


def test_datastore_holds_the_training_targets(built, mt_smoke_workdir):
  config, out, result = built
  train = parallel.encode_split(
      config.data.data_dir,
      "train",
      "de",
      "en",
      os.path.join(mt_smoke_workdir, runfiles.SPM_FILE),
      os.path.join(mt_smoke_workdir, "cache"),
  )
  # Stored in the order the pairs are read: each pair in the smallest
  # bucket that holds both sides, corpus order within a bucket, a pair's
  # target positions in order. Value j is the target token at position j.
  longest = [max(len(s), len(t)) for s, t in zip(train.source, train.target)]
  buckets = sorted(config.translation.buckets)
  fits = [
      train.target[i]
      for lo, hi in zip([0] + buckets[:-1], buckets)
      for i, n in enumerate(longest)
      if lo < n <= hi
  ]
  with open(out / "ds" / "manifest.json") as f:
    manifest = json.load(f)
  values = np.concatenate(
      [
          np.fromfile(out / "ds" / f"{s['name']}.values", np.int32)
          for s in manifest["shards"]
      ]
  )
  assert result["keys"] == sum(len(t) for t in fits) == len(values)
  np.testing.assert_array_equal(values, np.concatenate(fits))
  run = build.build(config, str(out))
  tuned = memjax.run_mode("mt_tune", config, str(out))
  assert tuned["tokens"] > 0 and len(tuned["grid"]) == 4
  # Every grid score against NumPy over the same teacher-forced positions
  # and exact neighbours.
  restored = tm._restore(run)  # pylint: disable=protected-access
  store = mt_datastore.open_store(restored, str(out / "ds"))
  neighbours = mt_datastore.Neighbours(
      search_lib.ExactSearcher(store, "squared_l2"), 4
  )
  s = run.settings
  tf = tm.teacher_forced_memory(
      s, restored, tm._split(s, restored, "valid"), neighbours, 8
  )  # pylint: disable=protected-access
  assert len(tf["tlp"]) == tuned["tokens"]
  assert tuned["nll_without_memory"] == pytest.approx(-np.mean(tf["tlp"]))
  nll = {}
  for row in tuned["grid"]:
    k = row["k"]
    p = numpy_target_prob(
        "knn",
        row,
        tf["tlp"],
        tf["log_z"],
        tf["scores"][:, :k],
        tf["values"][:, :k],
        tf["targets"],
    )
    assert row["nll"] == pytest.approx(-np.mean(np.log(p)), rel=1e-5)
    nll[k, row["knn_temperature"]] = row["nll"]
  assert nll[4, 1.0] != pytest.approx(nll[4, 10.0], rel=1e-4)
  assert nll[1, 1.0] == pytest.approx(nll[1, 10.0])  # one neighbour: w = 1
  # The tuned setting decodes the split: one line per sentence scored.
  config.translation.eval_max_sentences = 3
  translated = memjax.run_mode("mt_translate", config, str(out))
  assert translated["settings"] == tuned["best"]
  assert translated["sentences"] == 3 and 0 <= translated["bleu"] <= 100
  split = config.translation.split
  lines = (out / "translations" / f"{split}.knn.txt").read_text().split("\n")
  assert len(lines) == 4 and lines[-1] == ""


def test_datastore_mode_shows_what_the_memory_retrieves(built):
  config, out, result = built
  with open(out / "mt_retrieved.json") as f:
    saved = json.load(f)
  assert saved == result["retrieved"] and saved[0]["source"] == SHOWN
  positions = saved[0]["positions"]
  assert positions[-1]["token"] == "</s>"  # the greedy translation's EOS
  manifest = json.loads((out / "ds" / "manifest.json").read_text())
  values = np.concatenate(
      [
          np.fromfile(out / "ds" / f"{s['name']}.values", np.int32)
          for s in manifest["shards"]
      ]
  )
  run = build.build(config, str(out))
  restored = tm._restore(run)  # pylint: disable=protected-access
  stored = {restored.vocab.decode([int(v)]) or "</s>" for v in set(values)}
  for p in positions:
    # 4 neighbours (squared L2 for kNN-MT: scores -d^2, best first), each
    # a target piece of the training set.
    assert len(p["retrieved"]) == len(p["scores"]) == 4
    assert p["scores"] == sorted(p["scores"], reverse=True)
    assert all(s <= 0 for s in p["scores"]) and set(p["retrieved"]) <= stored
  # Each sentence's positions are its own greedy translation, one at a time.
  tr = parts.make_translator(
      run.settings.of(task_config.Translation),
      restored.model,
      restored.variables,
      restored.vocab,
  )
  assert [r["source"] for r in saved] == [SHOWN, SHOWN_2]
  for r in saved:
    ids = tr.translate_ids([tr.encode(r["source"])], beam_size=1)[0]
    pieces = [restored.vocab.decode([i]) or "</s>" for i in ids] + ["</s>"]
    assert [p["token"] for p in r["positions"]] == pieces


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("signature", {"model": {"d_model": 7}}, "another model"),
        ("context", {"vocab_sha1": "0" * 40}, "another vocabulary"),
    ],
)
def test_datastore_of_another_model_or_vocabulary(built, field, value, words):
  config, out, _ = built
  bad = out / f"bad_{field}"
  shutil.copytree(out / "ds", bad, dirs_exist_ok=True)
  manifest = json.loads((bad / "manifest.json").read_text())
  manifest[field] = value
  (bad / "manifest.json").write_text(json.dumps(manifest))
  work = out / f"work_{field}"
  with config.unlocked():
    config.mt_memory.datastore = str(bad)
  try:
    with pytest.raises(errors.CheckpointMismatchError, match=words) as e:
      tm.mt_tune(build.build(config, str(work)))
  finally:
    with config.unlocked():
      config.mt_memory.datastore = str(out / "ds")
  assert "\n" not in str(e.value)
  assert not work.exists()


@pytest.mark.parametrize(
    "key, value",
    [
        ("knn_lambda", 1.0),
        ("knn_lambda_grid", (0.2, 1.0)),
        ("interpolate_lambda_grid", (-0.1,)),
    ],
)
def test_lambda_outside_zero_one_is_refused(built, key, value):
  config, out, _ = built
  bad = config.copy_and_resolve_references()
  bad.mt_memory[key] = value
  work = out / f"work_{key}"
  with pytest.raises(errors.ConfigError, match=f"memory.{key} must lie in"):
    tm.mt_tune(build.build(bad, str(work)))
  assert not work.exists()


def test_datastore_built_as_two_shares_equals_the_one_process_build(built):
  config, out, _ = built
  config = config.copy_and_resolve_references()
  run = build.build(config, str(out))
  restored = tm._restore(run)  # pylint: disable=protected-access

  def settings():
    """The settings of ``config`` as the test has changed it so far."""
    return build.read(config, build.parts())

  train = tm._split(settings(), restored, "train")  # pylint: disable=protected-access
  mem = config.mt_memory
  mem.shard_keys = 1  # one batch per shard: several shards
  whole = mt_datastore.build(settings(), restored, train, str(out / "one"))
  assert whole is not None and len(whole.keys) >= 2
  mem.process_count = 2
  mem.process_index = 0
  assert (
      mt_datastore.build(settings(), restored, train, str(out / "two")) is None
  )
  assert not os.path.exists(out / "two" / "manifest.json")
  mem.process_index = 1  # the second process, run after: joins the shards
  joined = mt_datastore.build(settings(), restored, train, str(out / "two"))
  assert joined.count == whole.count and len(joined.keys) == len(whole.keys)
  for a, b in zip(whole.keys, joined.keys):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(whole.values, joined.values):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  mem.process_index = 2
  with pytest.raises(errors.ConfigError, match="process_index=2"):
    mt_datastore.process_share(settings())
