"""Bad input, as a new or hostile user gives it: one line
``memjax: error: ...``, exit status 2, and nothing written or left behind
(the command line); one clear exception (the API).
"""

import inspect
import os
import shutil
import time

import pytest

import memjax
from memjax import errors
from memjax.io import workdirs
from tests.conftest import run_main

SMOKE = "--config=configs/trime_wt103.py:smoke"
BM25 = "--config=configs/trime_wt103.py:trime_ext_smoke"

# (name, flags after --workdir, what the line must say). Each workdir is new.
CASES = [
    (
        "variant typo",
        ["--config=configs/trime_wt103.py:smok"],
        "unknown config variant 'smok'",
    ),
    ("stray argument", ["--mode=list", "extra"], "unexpected arguments"),
    (
        "dropout",
        [SMOKE, "--config.model.dropout=1.5"],
        "model.dropout must be in [0, 1), got 1.5",
    ),
    (
        "plan utilization",
        [SMOKE, "--mode=plan", "--config.plan.utilization=0"],
        "plan.utilization must be in (0, 1]",
    ),
    (
        "pack runner",
        [BM25, "--mode=pack", "--config.pack.runner=NoSuchRunner"],
        "pack.runner 'NoSuchRunner' is not a Beam runner",
    ),
    (
        "pack options",
        [
            BM25,
            "--mode=pack",
            "--config.pack.runner=DirectRunner",
            "--config.pack.options=--temp_locaton=/tmp",
        ],
        "Beam does not know: ['temp_locaton']",
    ),
    (
        "pack workers",
        [BM25, "--mode=pack", "--config.pack.workers=0"],
        "pack.workers must be >= 1",
    ),
    (
        "pack without BM25",
        [SMOKE, "--mode=pack"],
        "this run's data.batching is 'random'",
    ),
    (
        "remat policy, remat off",
        [SMOKE, "--config.model.remat_policy=bogus"],
        "model.remat_policy must be one of ['full', ",
    ),
    (
        "init_from nowhere",
        [SMOKE, "--config.train.init_from=/nonexistent/r"],
        "train.init_from=/nonexistent/r: /nonexistent/r holds no trained run",
    ),
    (
        "norm position",
        [SMOKE, "--config.model.norm_position=middle"],
        "model.norm_position must be one of ('pre', 'post'), got 'middle'",
    ),
    (
        "dtype",
        [SMOKE, "--config.model.dtype=float16"],
        "model.dtype must be one of ['float32', 'bfloat16'], got 'float16'",
    ),
]


def _one_line(proc) -> str:
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("memjax: error: "), lines
  assert "Traceback" not in proc.stderr
  return lines[0]


@pytest.mark.parametrize(
    "flags,says", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_command_line_answers_in_one_line_and_writes_nothing(
    flags, says, tmp_path
):
  workdir = tmp_path / "run"
  line = _one_line(run_main(*flags, f"--workdir={workdir}"))
  assert says in line, line
  assert not workdir.exists()
  assert os.listdir(tmp_path) == []


def test_help_exits_0():
  proc = run_main("--help")
  assert proc.returncode == 0 and "--workdir" in proc.stdout


def test_a_workdir_under_a_file_or_on_uncheckpointable_storage(tmp_path):
  parent = tmp_path / "a_file"
  parent.write_text("mine\n")
  line = _one_line(run_main(SMOKE, f"--workdir={parent}/run"))
  assert "is a file, not a folder" in line
  line = _one_line(run_main(SMOKE, "--workdir=memory://x"))
  assert "Orbax checkpoints" in line and "memory://" in line
  assert parent.read_text() == "mine\n"


def test_a_workdir_this_user_cannot_write_is_one_line(tmp_path, monkeypatch):
  """(As root every folder is writable, so the check's answer is set.)"""
  locked = tmp_path / "locked"
  locked.mkdir()
  real = os.access
  monkeypatch.setattr(
      os, "access", lambda p, m: False if p == str(locked) else real(p, m)
  )
  with pytest.raises(errors.StorageError, match="not writable by this user"):
    workdirs.check_workdir(str(locked / "run"), writes=True)
  workdirs.check_workdir(str(locked / "run"))  # Reading needs no write.


def test_a_run_stopped_before_its_first_checkpoint_says_so(
    smoke_workdir, tmp_path
):
  """kill -9 during the first checkpoint: config.json is there, no step
  finished (an Orbax temporary folder only)."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  shutil.copy(os.path.join(smoke_workdir, "config.json"), workdir)
  (workdir / "checkpoints" / "10.orbax-checkpoint-tmp-1").mkdir(parents=True)
  line = _one_line(run_main("--mode=eval", f"--workdir={workdir}"))
  assert "no finished checkpoint" in line and "config.json" not in line


def _damage(step_dir: str) -> None:
  """Overwrites the array files of a step (as a crash mid-write might)."""
  for root, _, files in os.walk(os.path.join(step_dir, "state")):
    for name in files:
      if name != "commit_success.txt":
        with open(os.path.join(root, name), "wb") as f:
          f.write(b"\0garbage")


def test_a_damaged_latest_checkpoint_falls_back_with_one_warning(
    smoke_workdir, tmp_path
):
  """eval and memjax.load read step 10 when step 20 is damaged; a reader
  moves nothing."""
  workdir = str(tmp_path / "run")
  shutil.copytree(smoke_workdir, workdir)
  steps = sorted(int(s) for s in os.listdir(f"{workdir}/checkpoints"))
  assert len(steps) >= 2
  _damage(f"{workdir}/checkpoints/{steps[-1]}")
  proc = run_main("--mode=eval", f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  warned = [l for l in proc.stderr.splitlines() if "cannot be read" in l]
  assert len(warned) == 1 and f"using step {steps[-2]}" in warned[0]
  assert "Traceback" not in proc.stderr
  assert memjax.load(workdir).step == steps[-2]
  assert sorted(int(s) for s in os.listdir(f"{workdir}/checkpoints")) == steps


def test_the_api_refuses_bad_arguments_in_one_error(smoke_workdir):
  model = memjax.load(smoke_workdir)
  with pytest.raises(errors.MissingRunError, match=r"the steps there are \["):
    memjax.load(smoke_workdir, step=12345)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    model.generate(["the", ""], num_tokens=2)
  # help(memjax.load) shows the real arguments and what they do.
  assert "mesh" in inspect.signature(memjax.load).parameters
  assert "checkpoint step" in memjax.load.__doc__


def test_translate_refuses_a_beam_below_one(mt_smoke_workdir):
  translator = memjax.load(mt_smoke_workdir)
  for beam in (0, -1, 1.5):
    with pytest.raises(ValueError, match="beam must be an integer >= 1"):
      translator.translate(["ein Haus"], beam=beam)


def test_scoring_through_the_api_logs_nothing_per_input(smoke_workdir, capsys):
  model = memjax.load(smoke_workdir)
  capsys.readouterr()
  model.score(["the cat sat", "on the mat"])
  assert "best" not in capsys.readouterr().out


def test_an_unanswering_bucket_is_one_error_within_seconds():
  pytest.importorskip("gcsfs")
  start = time.time()
  with pytest.raises(errors.StorageError):
    memjax.load("gs://memjax-no-such-bucket-for-tests/run")
  assert time.time() - start < workdirs.PROBE_TIMEOUT_S + 10
