"""The MARGE demo's rows: configs, row assembly and table (no training)."""

import math

import pytest

from memjax.demos import marge_rows


def _buckets(nlls, tokens):
  labels = ("1-16", "17-64", "65-256", "257+")
  return [
      dict(bucket=b, nll=n, tokens=t) for b, n, t in zip(labels, nlls, tokens)
  ]


def test_parse_rows_orders_and_adds_the_knn_base_run():
  assert marge_rows.parse_rows("pkm, knn") == ["vanilla", "knn", "pkm"]
  assert marge_rows.parse_rows("marge,vanilla") == ["vanilla", "marge"]
  with pytest.raises(ValueError, match="unknown --rows.*'rnn'"):
    marge_rows.parse_rows("vanilla,rnn")
  with pytest.raises(ValueError, match="unknown --rows"):
    marge_rows.parse_rows(" , ")


def test_extra_rows_match_the_vanilla_steps_and_tokens():
  ref = marge_rows.row_config("vanilla")
  # 400 steps of 16 windows of 64 tokens in configs/marge_wt103.py.
  assert marge_rows.train_tokens(ref) == 400 * 16 * 64
  assert ref.eval.splits == ("valid", "test")  # the reference row unchanged
  for name in ("txl", "trime_long", "knn", "pkm"):
    c = marge_rows.row_config(name, "/runs/vanilla")
    assert c.train.num_steps == ref.train.num_steps, name
    assert marge_rows.train_tokens(c) == marge_rows.train_tokens(ref), name
    assert c.data.corpus == ref.data.corpus == "wikitext103"
    assert c.position_loss.documents == "sections"
    assert c.eval.splits == ("test",)
  knn = marge_rows.row_config("knn", "/runs/vanilla")
  assert knn.train.init_from == "/runs/vanilla"
  assert (knn.eval_memory.kind, knn.position_loss.memory) == ("knn", "eval")
  trime = marge_rows.row_config("trime_long")
  assert trime.data.batch_size % trime.data.segments_per_lane == 0
  assert trime.eval_memory.long_mem_tokens > 0


def test_make_row_and_table():
  vanilla = marge_rows.row_config("vanilla")
  pos = {"test": {"buckets": _buckets([4.0, 5.0, 6.0, None], [10, 30, 60, 0])}}
  res = {"num_params": 1234567, "test": {"ppl": 250.0}}
  row = marge_rows.make_row("vanilla", vanilla, res, pos)
  # Hand-worked: (10 * 4 + 30 * 5 + 60 * 6) / 100 = 5.5 nats.
  assert row["section_ppl"] == pytest.approx(math.exp(5.5))
  assert row["ppl"] == 250.0 and row["train_tokens"] == 409600
  knn = marge_rows.make_row("knn", marge_rows.row_config("knn", "/v"), res, pos)
  assert knn["ppl"] is None  # it has no run of its own
  assert "lambda 0.25" in knn["label"]
  marge = marge_rows.make_row("marge", marge_rows.row_config("marge"), res, pos)
  off = _buckets([None, 5.5, 5.7, 5.6], [0, 5, 5, 5])
  marge["marge_eval"] = {
      "retrieval": {"ppl": 290.0, "buckets": off},
      "no_retrieval": {"ppl": 300.0, "buckets": off},
  }
  lines = marge_rows.format_table([row, knn, marge]).splitlines()
  assert len(lines) == 2 + 3 + 2
  assert all(line.count("|") == 10 for line in lines)
  assert lines[2] == (
      "| vanilla LM | 1,234,567 | 409,600 | 250.00 | 244.69 | 4.000 | "
      "5.000 | 6.000 | - |"
  )
  assert "| - | 244.69 |" in lines[3]
  assert lines[5].startswith("| MARGE, retrieval on (S_t+1 tokens only) |")
  assert "| 290.00 | - | - | 5.500 |" in lines[5]
  names = [n for n, _ in marge_rows.plot_series([row, knn, marge])]
  assert len(names) == 5 and names[-2:] == [
      "MARGE, retrieval on (S_t+1)",
      "MARGE, retrieval off (S_t+1)",
  ]
