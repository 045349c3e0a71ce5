"""memjax.run.loop: what the loop keeps of an interrupted job's log (the
loop itself runs end to end in test_ownership, test_preemption, test_hooks
and the mode tests)."""

import json

from memjax.run import loop


def _write(path, steps, tail=""):
  rows = [json.dumps({"step": s, "loss": float(s)}) + "\n" for s in steps]
  path.write_text("".join(rows) + tail)


def _steps(path):
  return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_resumed_log_keeps_the_steps_up_to_the_checkpoint(tmp_path):
  path = tmp_path / "train_log.jsonl"
  # Killed after step 7 while writing step 8's line; resumed from step 5.
  _write(path, range(1, 8), tail='{"step": 8, "lo')
  assert loop.cut_log(str(path), 5) == 3
  assert _steps(path) == [1, 2, 3, 4, 5]
  assert path.read_text().endswith("\n")


def test_a_log_with_nothing_past_the_checkpoint_is_not_rewritten(tmp_path):
  path = tmp_path / "train_log.jsonl"
  _write(path, range(1, 5))
  before = path.stat().st_mtime_ns, path.read_text()
  assert loop.cut_log(str(path), 4) == 0
  assert (path.stat().st_mtime_ns, path.read_text()) == before
  assert loop.cut_log(str(tmp_path / "absent.jsonl"), 3) == 0
  assert not (tmp_path / "absent.jsonl").exists()


def test_a_run_started_again_from_step_0_keeps_no_line(tmp_path):
  path = tmp_path / "train_log.jsonl"
  _write(path, range(1, 4))
  assert loop.cut_log(str(path), 0) == 3
  assert path.read_text() == ""
