"""End to end: TRIME trainings and the memory-evaluation modes on the smoke size."""

import csv
import json
import os

import matplotlib.image
import numpy as np
import pytest

import memjax
from configs import trime_wt103
from memjax import dispatch
from memjax.io import events
from memjax.modes import frequency

from tests.conftest import run_main  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests.conftest import set_memory  # pylint: disable=g-import-not-at-top,wrong-import-position


def _config(variant, **eval_memory):
  c = trime_wt103.get_config(variant)
  c.train.num_steps = 6
  c.train.log_every = 3
  c.train.eval_every = 0
  c.train.checkpoint_every = 6
  c.eval.max_windows = 12
  set_memory(c, **eval_memory)
  return c


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("trime_long"))
  config = _config(
      "trime_long_smoke",
      long_mem_grid=(0, 32),
      sweep_tokens=(0, 32, 64),
      temperature_grid=(0.8, 1.2),
      cache_theta_grid=(0.05,),
      cache_lambda_grid=(0.1, 0.2),
  )
  res = memjax.train(config, workdir)
  return config, workdir, res


def test_trime_long_trains_and_logs_memory_metrics(long_run):
  config, workdir, res = long_run
  assert res["step"] == 6 and np.isfinite(res["valid"]["ppl"])
  scalars = events.read_scalars(workdir)  # The TensorBoard events.
  memory = ("memory_on", "hide_local", "with_positive", "memory_share")
  for name in ("loss", "lm_loss") + memory:
    assert [s for s, _ in scalars[f"train/{name}"]] == [3, 6], name
  value = lambda tag: dict(scalars[tag])
  # round(0.05 * 6) = 0 warm-up steps: the memory is on at every step, and
  # the long memory never hides the local one.
  assert config.trime.lm_warmup_fraction * 6 < 0.5
  assert value("train/memory_on") == {3: 1.0, 6: 1.0}
  assert value("train/hide_local") == {3: 0.0, 6: 0.0}
  for step in (3, 6):
    assert 0.0 < value("train/with_positive")[step] <= 1.0
    assert 0.0 < value("train/memory_share")[step] < 1.0
    # The TRIME loss is not the plain LM loss once the memory is on.
    assert value("train/loss")[step] != value("train/lm_loss")[step]
  # The logged loss is the mean of the steps' losses since the last log
  # (every step has the same number of tokens).
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    losses = [json.loads(line)["loss"] for line in f]
  assert len(losses) == 6
  for step in (3, 6):
    np.testing.assert_allclose(
        value("train/loss")[step], np.mean(losses[step - 3 : step]), rtol=1e-5
    )
  for split in ("valid", "test"):
    nll = value(f"{split}/nll")[6]
    np.testing.assert_allclose(nll, res[split]["nll"], rtol=1e-6)
    np.testing.assert_allclose(value(f"{split}/ppl")[6], np.exp(nll), rtol=1e-5)


def test_tune_writes_best_setting_and_test_at_it(long_run):
  config, workdir, res = long_run
  out = memjax.run_mode("tune", config, workdir)
  with open(os.path.join(workdir, "tune.json")) as f:
    saved = json.load(f)
  assert saved["best"]["long_mem_tokens"] in (0, 32)
  assert saved["best"]["temperature"] in (0.8, 1.2)
  best_nll = min(r["nll"] for r in saved["grid_valid"])
  assert saved["valid"]["memory"]["nll"] == best_nll
  assert len(saved["grid_valid"]) == 4
  # The plain scores of the same pass equal the training run's evaluation.
  assert saved["valid"]["plain"]["nll"] == pytest.approx(
      res["valid"]["nll"], rel=1e-5
  )
  assert saved["test"]["plain"]["nll"] == pytest.approx(
      res["test"]["nll"], rel=1e-5
  )
  with open(os.path.join(workdir, "tune.csv")) as f:
    assert len(list(csv.DictReader(f))) == 4
  assert any(line.startswith("test: ppl") for line in out["summary_lines"])


def test_memsweep_writes_csv_and_plot(long_run):
  config, workdir, _ = long_run
  memjax.run_mode("memsweep", config, workdir)
  with open(os.path.join(workdir, "memsweep.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [(r["kind"], int(r["long_mem_tokens"])) for r in rows] == [
      ("trime", 0),
      ("trime", 32),
      ("trime", 64),
      ("cache", 0),
      ("cache", 32),
      ("cache", 64),
  ]
  # The figure read back: 5 x 3.5 inches at 120 dpi, with a line of each
  # kind in matplotlib's first two colours (C0 #1f77b4, C1 #ff7f0e).
  image = matplotlib.image.imread(os.path.join(workdir, "memsweep.png"))
  assert image.shape[:2] == (420, 600)
  pixels = np.round(image[..., :3] * 255).astype(int).reshape(-1, 3)
  for colour in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
    assert (np.abs(pixels - colour).max(-1) <= 2).sum() > 100, colour


def test_buckets_and_memeval(long_run):
  config, workdir, _ = long_run
  res = memjax.run_mode("buckets", config, workdir)
  rows = res["rows"]
  assert [r["bucket"] for r in rows][-1] == "avg"
  assert sum(r["tokens"] for r in rows[:-1]) == rows[-1]["tokens"]
  names = [k for k in rows[0] if k not in ("bucket", "tokens")]
  assert names[0] == "no memory" and names[1].startswith("trime memory")
  with open(os.path.join(workdir, "tune.json")) as f:
    tuned = json.load(f)
  # Buckets use the tuned setting; their average is the tuned valid score.
  assert rows[-1][names[1]] == pytest.approx(
      tuned["valid"]["memory"]["ppl"], rel=1e-5
  )
  assert "| tokens |" in frequency.merge([workdir, workdir])
  out = memjax.run_mode("memeval", config, workdir)
  assert (
      out["valid"]["memory"]["long_mem_tokens"]
      == config.eval_memory.long_mem_tokens
  )


def test_buckets_counted_on_train(long_run):
  """bucket_counts=train reads the training split's counts (it read none)."""
  config, workdir, _ = long_run
  by_valid = memjax.run_mode("buckets", config, workdir)["rows"]
  config = config.copy_and_resolve_references()
  config.eval_memory.bucket_counts = "train"
  by_train = memjax.run_mode("buckets", config, workdir)["rows"]
  # The same predictions, averaged alike, spread over other buckets: a
  # token's frequency in the training split is not its frequency in valid.
  assert by_train[-1] == by_valid[-1]
  assert sum(r["tokens"] for r in by_train[:-1]) == by_train[-1]["tokens"]
  assert [r["tokens"] for r in by_train] != [r["tokens"] for r in by_valid]


def test_frequency_buckets_by_count():
  counts = np.array([20000, 10000, 5000, 1000, 150, 100, 50, 10, 0])
  np.testing.assert_array_equal(
      frequency.bucket_of(counts, (10000, 1000, 100, 10)),
      [0, 1, 1, 2, 2, 3, 3, 4, 4],
  )
  assert frequency.bucket_labels((10000, 1000, 100, 10)) == [
      "> 10k",
      "1k-10k",
      "100-1k",
      "10-100",
      "<= 10",
  ]
  with pytest.raises(ValueError, match="decreasing"):
    frequency.bucket_of(counts, (10, 100))


def test_trime_ext_packs_offline_then_trains(tmp_path):
  config = _config("trime_ext_smoke")
  config.data.seq_len = 256  # ~1.9k segments: a quick BM25 search
  config.eval.window_len, config.eval.score_len = 256, 128
  config.model.max_len = 256
  config.data.cache_dir = str(tmp_path / "cache")
  run = str(tmp_path / "run")
  summary = memjax.run_mode("pack", config, run)  # then train, one workdir
  assert summary["segments"] == -(-483571 // 256)
  assert os.listdir(run) == ["bm25_pack.json"]
  dispatch.check_workdir(run, training=True)  # What main runs first.
  order_files = os.listdir(os.path.join(config.data.cache_dir, "bm25"))
  res = memjax.train(config, run)
  assert res["step"] == 6 and np.isfinite(res["valid"]["ppl"])
  assert os.listdir(os.path.join(config.data.cache_dir, "bm25")) == order_files


def test_tune_without_a_checkpoint_is_one_line_error(tmp_path):
  proc = run_main(
      "--config=configs/trime_wt103.py:trime_smoke",
      f"--workdir={tmp_path}",
      "--mode=tune",
      timeout=300,
  )
  assert proc.returncode == 2
  lines = [
      l for l in proc.stderr.splitlines() if l.startswith("memjax: error:")
  ]
  assert len(lines) == 1 and "holds no trained run" in lines[0], proc.stderr[
      -2000:
  ]
