"""The launch helpers assemble one consistent command per host."""

import importlib.util
import os

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
