"""The external-memory demo's rows: the baselines' local-memory evaluations,
the names tuning stages are kept under, and Table 2's layout (no training,
no datastore: the tuning is a stand-in)."""

import json

from memjax.demos import common
from memjax.demos import external_rows


def _config(method):
  c = common.load_config("trime_wt103", f"{method}_demo")
  c.eval_memory.search = "exact"  # as the exact-search stage leaves it
  return c


def _stand_in_tune(c, stages, calls):
  """``tune(stage)`` as the demo builds it, recording the memory it tunes."""

  def tune(stage):
    em = c.eval_memory
    name = external_rows.stage_name(stage, external_rows.memory_settings(c))
    return stages(
        name,
        lambda: calls.append((stage, em.kind, em.search, em.long_mem_grid))
        or {"best": {"long_mem_tokens": 0}},
    )

  return tune


def test_each_baseline_is_tuned_on_the_memories_of_its_match(tmp_path):
  for method, kind in (("vanilla", "knn_cache"), ("trime_ext", "trime_ext")):
    c, calls = _config(method), []
    before = c.eval_memory.to_dict()
    assert len(before["long_mem_grid"]) > 1  # M_long is tuned elsewhere
    stages = common.Stages(str(tmp_path / method))
    tune = _stand_in_tune(c, stages, calls)
    out = external_rows.tune_local(c, method, tune)
    assert out == {"best": {"long_mem_tokens": 0}}
    # M_local (and M_ext) only, searched with ScaNN, then as before.
    assert [call[1:] for call in calls] == [(kind, "scann", (0,))]
    assert c.eval_memory.to_dict() == before
    # Run again: kept, not tuned again.
    assert external_rows.tune_local(c, method, tune) == out
    assert len(calls) == 1


def test_a_stage_kept_with_other_settings_is_not_read_back(tmp_path):
  c, calls = _config("vanilla"), []
  stages = common.Stages(str(tmp_path / "vanilla"))
  tune = _stand_in_tune(c, stages, calls)
  # What the earlier demo kept: kNN-LM + cache with N = 1,024.
  (tmp_path / "vanilla").mkdir()
  old = {"best": {"long_mem_tokens": 1024}}
  (tmp_path / "vanilla" / "tune_knn_cache.json").write_text(json.dumps(old))
  assert external_rows.tune_local(c, "vanilla", tune) != old
  assert len(calls) == 1
  # A changed grid is a new stage; the settings' order is not.
  c.cache.cache_lambda_grid = (0.1, 0.2)
  external_rows.tune_local(c, "vanilla", tune)
  assert len(calls) == 2
  a = external_rows.stage_name("tune_scann", {"n": (0, 1), "kind": "knn"})
  b = external_rows.stage_name("tune_scann", {"kind": "knn", "n": [0, 1]})
  assert a == b and a.startswith("tune_scann_") and len(a) == 21
  assert a != external_rows.stage_name("tune_scann", {"kind": "knn", "n": [0]})
  files = sorted(p.name for p in (tmp_path / "vanilla").iterdir())
  assert len(files) == 3 and "tune_knn_cache.json" in files  # nothing lost


def _tuned(setting, valid, test):
  return {
      "best": setting,
      "valid": {"memory": {"ppl": valid}, "plain": {"ppl": 205.23}},
      "test": {"memory": {"ppl": test}, "plain": {"ppl": 219.92}},
  }


def test_table_sets_each_baseline_beside_its_match():
  knn = {"long_mem_tokens": 0, "knn_temperature": 1.0, "knn_lambda": 0.25}
  cache = {"long_mem_tokens": 0, "cache_theta": 0.1, "cache_lambda": 0.3}
  ext = {"long_mem_tokens": 0, "temperature": 1.25}
  van = {
      "method": "vanilla",
      "scann": _tuned(knn, 180.8, 192.07),
      "exact": {"test": {"ppl": 192.1}},
      "recall": {"recall": 0.96},
      "without_long": _tuned(dict(knn, **cache), 150.0, 170.0),
  }
  trime = {
      "method": "trime_ext",
      "scann": _tuned(dict(ext, long_mem_tokens=1024), 143.09, 176.72),
      "exact": {"test": {"ppl": 176.72}},
      "recall": {"recall": 0.974},
      "local_long": _tuned(dict(ext, long_mem_tokens=1024), 145.48, 184.93),
      "without_long": _tuned(ext, 150.5, 180.25),
  }
  lines = external_rows.format_table([van, trime]).splitlines()
  cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
  assert [row[:2] for row in cells] == [
      ["vanilla", "-"],
      ["TRIMELM_ext", "-"],
      ["vanilla + kNN-LM", "M_ext"],
      ["vanilla + kNN-LM + continuous cache", "M_local; M_ext"],
      ["TRIMELM_ext", "M_local u M_long"],
      ["TRIMELM_ext without M_long", "M_local u M_ext"],
      ["TRIMELM_ext", "M_local u M_long u M_ext"],
  ]
  # The pair read M_local (N = 0) and M_ext; no exact-search score.
  assert cells[3][2].startswith("N=0, ") and "cache_lambda=0.3" in cells[3][2]
  assert cells[3][3:] == ["150.00", "170.00", "-", "-"]
  assert cells[5][2] == "N=0, temperature=1.25"
  assert cells[5][3:] == ["150.50", "180.25", "-", "-"]
  assert cells[6][3:] == ["143.09", "176.72", "176.72", "0.974"]
