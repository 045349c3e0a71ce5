"""The TRIME demo's rows: each cache baseline tunes over the memories of the
TRIME row beside it, a row is tuned again over what an earlier demo left,
and the table (no training: the tuning is replaced by a stand-in)."""

import json

import memjax
from memjax import build
from memjax.demos import common
from memjax.demos import trime_rows
from memjax.eval import grid as grid_lib

LABELS = [
    "vanilla",
    "vanilla + continuous cache",
    "TRIMELM",
    "vanilla + continuous cache (long)",
    "TRIMELM_long",
]


def _sizes(demo, row):
  """The sizes N the row's tuning tries."""
  cfg = demo.config(row.config, row.variant)
  if "memory" in row.options:
    trime_rows.tuned_memory(demo, row, cfg)
  parts = build.parts()
  s = build.read(cfg, parts)
  kind = s.eval_memory.kind
  grid = grid_lib.tuning_grid(s, parts.eval_memories, kind)
  return kind, tuple(grid.long_sizes)


def test_each_cache_row_reads_the_memories_of_the_trime_row_beside_it(
    tmp_path,
):
  demo = common.Demo(str(tmp_path))
  rows = {r.label: r for r in trime_rows.ROWS}
  assert list(rows) == LABELS  # Table 2's order, each pair side by side
  # Table 2: Grave et al.'s cache over M_local only, as TRIMELM reads it.
  assert _sizes(demo, rows["vanilla + continuous cache"]) == ("cache", (0,))
  assert _sizes(demo, rows["TRIMELM"]) == ("trime", (0,))
  # Figure 3: the cache extended to M_long, over TRIMELM_long's sizes.
  long_sizes = (0, 1024, 2048, 4096)
  assert _sizes(demo, rows["vanilla + continuous cache (long)"]) == (
      "cache",
      long_sizes,
  )
  assert _sizes(demo, rows["TRIMELM_long"]) == ("trime", long_sizes)
  assert rows["vanilla + continuous cache (long)"].base == "vanilla"


def _tuned(n, theta, lam, test_ppl):
  best = {"long_mem_tokens": n, "cache_theta": theta, "cache_lambda": lam}
  return {
      "valid": {"memory": {"ppl": test_ppl + 1.0}},
      "test": {"memory": {"ppl": test_ppl}},
      "best": best,
      "grid_valid": [dict(best, ppl=test_ppl + 1.0)],
  }


def test_a_cache_row_is_tuned_again_not_read_back(tmp_path, monkeypatch):
  demo = common.Demo(str(tmp_path))
  vanilla = {
      "num_params": 1252312,
      "step": 400,
      "train_tokens_per_s": 1951.0,
      "valid": {"ppl": 264.15},
      "test": {"ppl": 233.66},
      "unigram": {"valid": {"ppl": 524.59}, "test": {"ppl": 476.42}},
  }
  (tmp_path / "vanilla").mkdir()
  (tmp_path / "vanilla" / "row.json").write_text(json.dumps(vanilla))
  # What the demo wrote before its cache row took N = 0 only.
  stale = tmp_path / "vanilla___continuous_cache"
  stale.mkdir()
  (stale / "row.json").write_text(
      json.dumps(dict(vanilla, **_tuned(4096, 0.2, 0.4, 176.91)))
  )
  calls = []

  def fake_run_mode(name, cfg, workdir):
    assert name == "tune"
    del workdir
    em = cfg.eval_memory
    calls.append((em.kind, tuple(em.long_mem_grid), cfg.train.init_from))
    n = max(em.long_mem_grid)
    return _tuned(n, 0.05, 0.2, 189.99) if n == 0 else _tuned(n, 0.2, 0.4, 1.0)

  # memjax.run_mode is resolved on first read (memjax.__getattr__): set here
  # in the module's namespace, and taken away again after the test.
  monkeypatch.setattr(memjax, "run_mode", fake_run_mode, raising=False)
  rows = {r.label: r for r in trime_rows.ROWS}
  cache = trime_rows.run_row(demo, rows["vanilla + continuous cache"], None)
  assert calls == [("cache", (0,), str(tmp_path / "vanilla"))]
  saved = json.loads((stale / "row.json").read_text())
  assert saved == cache
  assert saved["best"] == {
      "long_mem_tokens": 0,
      "cache_theta": 0.05,
      "cache_lambda": 0.2,
  }
  assert saved["test"] == {"ppl": 189.99}
  assert saved["test_plain"] == {"ppl": 233.66}  # the vanilla run's
  assert "train_tokens_per_s" not in saved  # it trains nothing
  long = trime_rows.run_row(
      demo, rows["vanilla + continuous cache (long)"], None
  )
  assert calls[1][:2] == ("cache", (0, 1024, 2048, 4096))
  assert (tmp_path / "vanilla___continuous_cache__long" / "row.json").exists()
  plain = vanilla | {"row": "vanilla", "test_plain": vanilla["test"]}
  table = trime_rows.format_table([plain, cache, long])
  lines = table.splitlines()
  assert lines[0].startswith("| model | params | steps | memory at evaluation")
  assert lines[2] == (
      "| vanilla | 1,252,312 | 400 | - | 264.15 | 233.66 | 233.66 | 1951 |"
  )
  assert lines[3] == (
      "| vanilla + continuous cache | 1,252,312 | 400 | N=0, theta=0.05, "
      "lambda=0.2 | 190.99 | 189.99 | 233.66 | - |"
  )
  assert lines[4].startswith(
      "| vanilla + continuous cache (long) | 1,252,312 | 400 | N=4096, "
      "theta=0.2, lambda=0.4 |"
  )
  assert lines[5] == (
      "| unigram (train counts, add-one) | - | - | - | 524.59 | 476.42 | - | - |"
  )
