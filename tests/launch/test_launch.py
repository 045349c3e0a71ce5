"""The launch helpers assemble one consistent command per host, and put the
checkout and its venv on every worker of a TPU slice (run offline here)."""

import importlib.util
import os
import shutil
import subprocess

import pytest

_spec = importlib.util.spec_from_file_location(
    "launch",
    os.path.join(os.path.dirname(__file__), "..", "..", "launch", "launch.py"),
)
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)


def test_manual_commands_have_distinct_process_ids():
  cmd = launch.main_command(
      "configs/trime_wt103.py:247m", "/runs/x", ["--config.seed=3"]
  )
  cmds = launch.manual_commands(3, "10.0.0.1:1234", cmd)
  assert [c[-1] for c in cmds] == [
      "--process_id=0",
      "--process_id=1",
      "--process_id=2",
  ]
  for c in cmds:
    assert "--multihost" in c and "--config.seed=3" in c
    assert (
        "--coordinator_address=10.0.0.1:1234" in c and "--num_processes=3" in c
    )


def test_slurm_script_runs_one_task_per_node():
  cmd = launch.main_command("configs/trime_wt103.py:247m", "/runs/x", [])
  script = launch.slurm_script(4, 8, "/repo", cmd)
  assert (
      "#SBATCH --nodes=4" in script and "#SBATCH --ntasks-per-node=1" in script
  )
  assert "srun .venv/bin/python -m memjax.main" in script
  assert "--multihost" in script


def test_tpu_command_targets_all_workers():
  cmd = launch.main_command("c.py:demo", "gs://b/r", [])
  full = launch.tpu_command("pod", "zone-a", "~/memjax", cmd)
  assert full[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
  assert "--worker=all" in full
  assert full[-1].startswith("--command=cd ~/memjax && ")


def _fake_tools(bin_dir, log, names):
  """Executables that log their arguments (and directory) and succeed,
  beside links to the real tar, gzip, mkdir and rm."""
  bin_dir.mkdir()
  for name in names:
    tool = bin_dir / name
    tool.write_text(f'#!/bin/sh\necho "{name} $PWD $*" >> {log}\n')
    tool.chmod(0o755)
  for name in ("tar", "gzip", "mkdir", "rm"):
    os.symlink(shutil.which(name), bin_dir / name)


@pytest.mark.parametrize("has_python311", [True, False])
def test_tpu_setup_puts_the_checkout_and_its_venv_on_every_worker(
    tmp_path, has_python311
):
  checkout = tmp_path / "checkout"
  checkout.mkdir()
  (checkout / "setup.py").write_text("# memjax\n")
  git = [
      "git",
      "-c",
      "user.name=t",
      "-c",
      "user.email=t@t",
      "-C",
      str(checkout),
  ]
  for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
    subprocess.run(git + args, check=True, capture_output=True)
  (checkout / "uncommitted.py").write_text("")
  archive, scp, ssh = launch.tpu_setup_commands(
      "pod", "zone-a", str(checkout), "~/memjax", local_dir=str(tmp_path)
  )
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod"]
  for command in (scp, ssh):
    assert "--worker=all" in command and "--zone=zone-a" in command
  # Offline: the archive is made here; the copy lands in a fake worker's
  # home; the worker's command runs there with logging stand-ins for sudo,
  # make and python3.11.
  subprocess.run(archive, check=True)
  home = tmp_path / "home"
  home.mkdir()
  assert scp[6] == "pod:~/memjax.tar.gz"
  shutil.copy(scp[5], home / "memjax.tar.gz")
  log = tmp_path / "log"
  tools = ["sudo", "make"] + (["python3.11"] if has_python311 else [])
  _fake_tools(tmp_path / "bin", log, tools)
  remote = ssh[-1].removeprefix("--command=")
  subprocess.run(
      ["/bin/bash", "-c", remote],
      check=True,
      env={"HOME": str(home), "PATH": str(tmp_path / "bin")},
  )
  repo = home / "memjax"
  assert sorted(os.listdir(repo)) == ["setup.py"]  # HEAD, not the work tree
  assert not (home / "memjax.tar.gz").exists()
  lines = log.read_text().splitlines()
  assert lines[-1] == f"make {repo} venv ACCEL=tpu PYTHON=python3.11"
  sudo = [l for l in lines if l.startswith("sudo ")]
  if has_python311:
    assert not sudo
  else:
    assert "add-apt-repository -y ppa:deadsnakes/ppa" in sudo[0]
    assert sudo[-1].endswith("apt-get install -y -q python3.11 python3.11-venv")
