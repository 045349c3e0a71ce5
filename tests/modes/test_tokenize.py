"""--mode=tokenize: the token caches a run reads, and nothing else."""

import os

import numpy as np

from memjax import build
from memjax.modes import tokenize
from tests import shared_runs


def test_tokenize_writes_the_caches_training_reads(tmp_path):
  config = shared_runs.core_config("lm", shared_runs.core_data("lm", tmp_path))
  config.data.cache_dir = str(tmp_path / "cache")
  workdir = str(tmp_path / "run")
  run = build.build(config, workdir)
  out = tokenize.tokenize(run)
  names = sorted(os.path.basename(f) for f in out["files"])
  assert [n.split(".")[1] for n in names] == ["test", "train", "valid", "vocab"]
  assert not os.path.exists(workdir)  # A cache elsewhere: no workdir made.
  stamps = {f: os.stat(f).st_mtime_ns for f in out["files"]}
  corpus = run.task.load(workdir)  # What training reads.
  assert {f: os.stat(f).st_mtime_ns for f in out["files"]} == stamps
  with np.load([f for f in out["files"] if ".train." in f][0]) as z:
    np.testing.assert_array_equal(corpus.train.tokens, z["tokens"])
  # The demo training text has 12,907 word types (with the specials).
  assert corpus.vocab_size == 12907
