"""End to end: the smoke config through memjax.main, resume, and bad input."""

import glob
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

import memjax
from configs import trime_wt103
from memjax import build
from memjax.run import loop
from tests.conftest import run_main
from tests import shared_runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _losses(workdir):
  with open(os.path.join(workdir, "train_log.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f)}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, smoke_workdir):
  """A copy of the session's smoke run (configs/trime_wt103.py:smoke trained
  by memjax.main), which these tests resume and damage, and what memjax.main
  printed while training it."""
  workdir = str(tmp_path_factory.mktemp("smoke") / "run")
  shutil.copytree(smoke_workdir, workdir)
  return workdir, types.SimpleNamespace(
      stdout=shared_runs.shared_stdout(smoke_workdir)
  )


def test_smoke_writes_events_checkpoint_and_results(smoke_run):
  workdir, proc = smoke_run
  assert glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "20", "state"))
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["step"] == 20
  for split in ("valid", "test"):
    r = results[split]
    assert np.isfinite(r["ppl"]) and r["ppl"] == pytest.approx(np.exp(r["nll"]))
    assert r["tokens"] > 0
  assert "valid: ppl" in proc.stdout and "test: ppl" in proc.stdout


def test_resume_with_more_steps_needs_extend_schedule(smoke_run):
  workdir, _ = smoke_run
  args = (
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--config.train.num_steps=25",
      "--config.train.checkpoint_every=5",
  )
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  proc = run_main(*args)
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith("memjax: error:") and "20-step schedule" in line
  assert "extend_schedule=True" in line and "init_from" in line
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before
  proc = run_main(*args, "--config.train.extend_schedule=True")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resumed from" in proc.stdout and "at step 20" in proc.stdout
  assert "training from step 20 to 25" in proc.stdout
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f)["step"] == 25


def test_resume_with_other_data_settings_is_refused(smoke_run):
  workdir, _ = smoke_run
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--config.train.num_steps=25",
      "--config.seed=3",
      "--config.data.batching=blocks",
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = proc.stderr.strip().splitlines()[-1]
  assert "other data settings" in line and "seed: 0 -> 3" in line
  assert "data.batching: 'random' -> 'blocks'" in line


def test_damaged_latest_checkpoint_falls_back_to_the_previous(smoke_run):
  workdir, _ = smoke_run
  ckpt = os.path.join(workdir, "checkpoints")
  assert "25" in os.listdir(ckpt) and "20" in os.listdir(ckpt)
  # Damage the array data of the latest step.
  for root, _, files in os.walk(os.path.join(ckpt, "25", "state")):
    for name in files:
      if "ocdbt" in root or name.startswith("d"):
        with open(os.path.join(root, name), "wb") as f:
          f.write(b"\0garbage")
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--config.train.num_steps=25",
      "--config.train.checkpoint_every=5",
      # Step 20 was saved with the run's first, 20-step horizon.
      "--config.train.extend_schedule=True",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "checkpoint step 25" in proc.stderr and "damaged" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert "resumed from" in proc.stdout and "at step 20" in proc.stdout
  assert os.path.isdir(os.path.join(ckpt, "damaged-25"))  # Kept, not deleted.
  assert os.path.isdir(os.path.join(ckpt, "25", "state"))  # Written anew.


def test_checkpoint_of_another_model_is_refused_and_kept(smoke_run):
  workdir, _ = smoke_run
  ckpt_dir = os.path.join(workdir, "checkpoints")
  before = sorted(os.listdir(ckpt_dir))
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--config.model.d_model=48",
      "--config.train.num_steps=40",
  )
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert (
      err[-1].startswith("memjax: error: checkpoint")
      and "d_model: 32 -> 48" in err[-1]
  )
  assert sorted(os.listdir(ckpt_dir)) == before


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--config.foo=1"], "unknown config key foo"),
        (["--config.data.data_dir=/nonexistent/wt"], "/nonexistent/wt"),
        (["--config.mesh.data=3"], "has 3 devices but 1 are available"),
        (["--config.train.num_steps=-5"], "train.num_steps must be a positive"),
        (["--config.train.num_steps=abc"], "--config.train.num_steps=abc"),
        (["--config.model.attention=nope"], "unknown model.attention 'nope'"),
        (
            ["--config.data.batch_size=7", "--config.train.grad_accum=2"],
            "not divisible",
        ),
    ],
)
def test_bad_input_exits_with_one_clear_line(tmp_path, args, needle):
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke", f"--workdir={tmp_path}", *args
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  lines = [
      l for l in proc.stderr.splitlines() if l.startswith("memjax: error:")
  ]
  assert len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]


class _Interrupt(Exception):
  pass


def test_interrupted_and_resumed_run_matches_uninterrupted(tmp_path):
  config = trime_wt103.get_config("smoke")
  config.train.num_steps = 8
  config.train.log_every = 1
  config.train.checkpoint_every = 4
  config.train.eval_every = 0
  config.eval.max_windows = 4
  whole = str(tmp_path / "whole")
  res_whole = memjax.train(config, whole)

  def stop_after_4(step, state):
    if step == 4:
      raise _Interrupt()

  parts = str(tmp_path / "parts")
  with pytest.raises(_Interrupt):
    loop.train_and_evaluate(build.build(config, parts), hooks=(stop_after_4,))
  res_parts = memjax.train(config, parts)
  a, b = _losses(whole), _losses(parts)
  assert sorted(a) == list(range(1, 9)) and sorted(b) == list(range(1, 9))
  np.testing.assert_allclose(
      [a[s] for s in range(1, 9)], [b[s] for s in range(1, 9)], rtol=1e-6
  )
  assert res_parts["valid"]["nll"] == pytest.approx(
      res_whole["valid"]["nll"], rel=1e-6
  )


def test_init_from_evaluates_another_run_on_eight_devices(smoke_run, tmp_path):
  workdir, _ = smoke_run
  with open(os.path.join(workdir, "results.json")) as f:
    source = json.load(f)
  config = trime_wt103.get_config("smoke")
  config.train.init_from = workdir
  # The source run trained on one device; this one restores onto eight.
  res = memjax.run_mode("eval", config, str(tmp_path / "from"))
  assert res["step"] == source["step"] and res["checkpoint"] == workdir
  assert res["valid"]["nll"] == pytest.approx(source["valid"]["nll"], rel=1e-5)


def test_workdir_that_is_a_file(tmp_path):
  path = tmp_path / "afile"
  path.write_text("x")
  proc = run_main("--config=configs/trime_wt103.py:smoke", f"--workdir={path}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "is not a directory" in proc.stderr.strip().splitlines()[-1]


def test_corpus_that_is_not_utf8_is_named_and_nothing_is_written(tmp_path):
  data = tmp_path / "wt"
  shutil.copytree(
      os.path.join(REPO, "demo_data", "wikitext"),
      data,
      ignore=shutil.ignore_patterns("memjax_cache"),
  )
  train_file = data / "wiki.train.tokens"
  train_file.write_bytes(train_file.read_bytes()[:5000] + b"caf\xc2 x\n")
  workdir = tmp_path / "run"
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      f"--config.data.data_dir={data}",
  )
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  line = proc.stderr.strip().splitlines()[-1]
  assert str(train_file) in line and "not UTF-8" in line
  assert not workdir.exists()


def test_init_from_a_run_of_another_model_is_one_line(smoke_run, tmp_path):
  workdir, _ = smoke_run
  proc = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={tmp_path / 'new'}",
      f"--config.train.init_from={workdir}",
      "--config.model.d_model=48",
  )
  assert proc.returncode == 2
  assert "Traceback" not in proc.stderr and "Event loop" not in proc.stderr
  line = proc.stderr.strip().splitlines()[-1]
  assert "differ in shape" in line and "init_from" in line


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
  # An exception that is not a UserError is not reduced to one line: a
  # mode added from outside memjax that fails on the run it is given.
  proc = subprocess.run(
      [
          sys.executable,
          "-c",
          "import json, sys; from memjax import extend, main; "
          "extend.add(extend.Method(name='bug', "
          "modes={'bug': extend.Mode(json.loads)})); "
          "sys.argv = ['memjax', '--config=configs/trime_wt103.py:smoke', "
          f"'--mode=bug', '--workdir={tmp_path}']; "
          "from absl import app; app.run(main.main, flags_parser=main.parse_flags)",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode != 0 and proc.returncode != 2
  assert "Traceback" in proc.stderr and "memjax: error" not in proc.stderr


# -- discovering the modes ------------------------------------------------------


def test_mode_list_and_help_show_every_mode_with_its_kinds(tmp_path):
  listed = run_main("--mode=list", timeout=120)
  assert listed.returncode == 0, listed.stderr[-2000:]
  helped = run_main("--help", timeout=120)  # absl exits 1 after --help.
  assert "--mode:" in helped.stdout, helped.stderr[-2000:]
  lines = listed.stdout.splitlines()
  end = lines.index("run kinds (task/model.family):")
  rows = {l.split()[0]: l.split()[1] for l in lines[1:end]}
  # Every mode the methods and the engine declare, and no other.
  modes = build.parts().modes.names()
  assert set(rows) == set(modes) and len(rows) >= 22
  assert rows["train"] == "any" and rows["translate"] == "translation"
  assert rows["marge_eval"] == "lm/marge" and rows["memeval"] == "lm/decoder_lm"
  help_text = " ".join(helped.stdout.split())
  for name in modes:
    assert f" {name} " in help_text, name
  assert not os.listdir(tmp_path)  # --mode=list needs no workdir.


@pytest.mark.parametrize(
    "config,mode,wanted,got",
    [
        (
            "configs/trime_iwslt.py:smoke",
            "position_loss",
            "kind lm (decoder language model",
            "this run is translation/encoder_decoder",
        ),
        (
            "configs/pkm_bert.py:pkm_smoke",
            "memory_usage",
            "kind lm/decoder_lm",
            "this run is mlm/encoder",
        ),
        (
            "configs/trime_wt103.py:smoke",
            "translate",
            "kind translation",
            "this run is lm/decoder_lm",
        ),
    ],
)
def test_a_mode_given_another_kind_of_run_names_the_kinds_it_takes(
    tmp_path, config, mode, wanted, got
):
  workdir = tmp_path / "run"
  proc = run_main(
      f"--config={config}", f"--workdir={workdir}", f"--mode={mode}"
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert f"--mode={mode} takes a run of {wanted}" in lines[0]
  assert got in lines[0] and "--mode=list" in lines[0]
  assert not workdir.exists()  # Refused before anything was written.


def test_the_console_script_is_memjax_main():
  import ast  # pylint: disable=g-import-not-at-top

  with open(os.path.join(REPO, "setup.py")) as f:
    tree = ast.parse(f.read())
  scripts = [
      ast.literal_eval(k.value)["console_scripts"]
      for node in ast.walk(tree)
      if isinstance(node, ast.Call)
      for k in node.keywords
      if k.arg == "entry_points"
  ]
  assert scripts == [["memjax = memjax.main:run"]]
  # What the script runs: memjax.main.run, as `python -m memjax.main` does
  # (its module is not __main__ there: --help still shows its flags).
  for arg, shown in (("--mode=list", " tune "), ("--help", "--mode:")):
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from memjax import main; "
            f"sys.argv = ['memjax', {arg!r}]; main.run()",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and shown in proc.stdout, proc.stderr


# Three command lines in one process through memjax.main.cli: each prints its
# status; an override of the second must be gone in the third (it checks
# train.num_steps first, so a left-over -5 would be named again).
_CLI_SCRIPT = """
import sys
from memjax import main
smoke = ["--config=configs/trime_wt103.py:smoke", "--workdir=" + sys.argv[1]]
for argv in (["--mode=list"], smoke + ["--config.train.num_steps=-5"],
             smoke + ["--config.data.data_dir=/nonexistent/wt"],
             ["--mode=nope", "--workdir=" + sys.argv[1]]):
  print("status", main.cli(argv), flush=True)
  print("status", file=sys.stderr, flush=True)
"""


def test_cli_runs_command_lines_in_process_each_parsed_anew(tmp_path):
  """memjax.main.cli: each command line's output and exit status, in the
  calling process; nothing of one call's flags in the next."""
  proc = subprocess.run(
      [sys.executable, "-c", _CLI_SCRIPT, str(tmp_path)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  statuses = [l for l in proc.stdout.splitlines() if l.startswith("status")]
  assert statuses == ["status 0", "status 2", "status 2", "status 2"]
  assert " tune " in proc.stdout
  errors = [e.strip() for e in proc.stderr.split("status\n")[1:]]
  assert errors[0] == (
      "memjax: error: train.num_steps must be a positive integer, got -5"
  )
  assert errors[1].count("\n") == 0 and "/nonexistent/wt" in errors[1]
  assert "num_steps" not in errors[1]
  assert errors[2].startswith("memjax: error: unknown --mode 'nope'")
  assert not os.listdir(tmp_path)


def test_the_suites_long_lived_main_answers_as_a_fresh_process(tmp_path):
  """conftest.run_main's server (memjax.main.cli in one long-lived process)
  prints and exits as `python -m memjax.main` does."""
  for args in (
      ("--mode=list",),
      (
          "--config=configs/trime_wt103.py:smoke",
          f"--workdir={tmp_path}",
          "--config.train.num_steps=-5",
      ),
      ("--mode=eval", f"--workdir={tmp_path / 'none'}"),
  ):
    served, fresh = run_main(*args), run_main(*args, fresh=True)
    assert served.returncode == fresh.returncode, (args, served, fresh)
    assert served.stdout == fresh.stdout, args
    assert served.stderr.strip() == fresh.stderr.strip(), args


def test_make_help_lists_every_target_with_its_minutes():
  proc = subprocess.run(
      ["make", "-s", "help"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert proc.returncode == 0, proc.stderr
  listed = {l.split()[0]: l for l in proc.stdout.splitlines()}
  with open(os.path.join(REPO, "Makefile")) as f:
    phony = next(l for l in f if l.startswith(".PHONY:")).split()[1:]
  assert set(listed) == set(phony) - {"help"}
  assert "~10 min" in listed["demo"] and "min" in listed["test"]
