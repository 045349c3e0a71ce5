"""Assembles the commands that start a memjax run on many hosts.

Every host runs the same ``python -m memjax.main ... --multihost`` command;
``jax.distributed.initialize()`` then finds the coordinator from the TPU
metadata, from SLURM's variables, or from the explicit
``--coordinator_address/--num_processes/--process_id`` flags.

    # TPU pod slice (all workers at once, through gcloud):
    python launch/launch.py tpu --tpu=my-v4-64 --zone=us-central2-b \\
        --config=configs/trime_wt103.py:247m --workdir=gs://bucket/runs/247m
    # Multi-node GPU cluster with SLURM (prints an sbatch script):
    python launch/launch.py slurm --nodes=4 --gpus_per_node=8 \\
        --config=configs/trime_wt103.py:247m --workdir=/shared/runs/247m > run.sbatch
    # Any cluster without a scheduler: one command per node.
    python launch/launch.py manual --nodes=2 --coordinator=10.0.0.1:1234 \\
        --config=configs/trime_wt103.py:247m --workdir=/shared/runs/247m

Nothing is executed unless ``--run`` is given (tpu only); the commands are
printed so they can be checked, edited and kept with the experiment.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys


def main_command(
    config: str,
    workdir: str,
    overrides: list[str],
    python: str = ".venv/bin/python",
) -> list[str]:
  """The per-host training command."""
  return [
      python,
      "-m",
      "memjax.main",
      f"--config={config}",
      f"--workdir={workdir}",
      "--multihost",
      *overrides,
  ]


def tpu_command(
    tpu: str, zone: str, repo_dir: str, cmd: list[str]
) -> list[str]:
  """gcloud command that runs ``cmd`` on every worker of a TPU VM slice."""
  remote = (
      f"cd {repo_dir} && {shlex.join(cmd)}"  # unquoted: ~ must expand remotely
  )
  return [
      "gcloud",
      "compute",
      "tpus",
      "tpu-vm",
      "ssh",
      tpu,
      f"--zone={zone}",
      "--worker=all",
      f"--command={remote}",
  ]


def slurm_script(
    nodes: int,
    gpus_per_node: int,
    repo_dir: str,
    cmd: list[str],
    job_name: str = "memjax",
    time: str = "72:00:00",
) -> str:
  """An sbatch script: one task per node, each task sees all its GPUs.

  jax.distributed.initialize() reads SLURM_* variables, so no addresses are
  needed; XLA's NCCL settings are left to the cluster's defaults.
  """
  return "\n".join(
      [
          "#!/bin/bash",
          f"#SBATCH --job-name={job_name}",
          f"#SBATCH --nodes={nodes}",
          "#SBATCH --ntasks-per-node=1",
          f"#SBATCH --gpus-per-node={gpus_per_node}",
          f"#SBATCH --time={time}",
          "#SBATCH --output=%x-%j.out",
          "set -euo pipefail",
          f"cd {shlex.quote(repo_dir)}",
          f"srun {shlex.join(cmd)}",
          "",
      ]
  )


def manual_commands(
    nodes: int, coordinator: str, cmd: list[str]
) -> list[list[str]]:
  """One command per node with explicit coordinator and process ids."""
  return [
      cmd
      + [
          f"--coordinator_address={coordinator}",
          f"--num_processes={nodes}",
          f"--process_id={i}",
      ]
      for i in range(nodes)
  ]


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("target", choices=["tpu", "slurm", "manual"])
  p.add_argument("--config", required=True)
  p.add_argument("--workdir", required=True)
  p.add_argument("--repo_dir", default="~/memjax")
  p.add_argument("--python", default=".venv/bin/python")
  p.add_argument("--tpu")
  p.add_argument("--zone")
  p.add_argument("--nodes", type=int, default=1)
  p.add_argument("--gpus_per_node", type=int, default=8)
  p.add_argument("--coordinator", help="host:port of process 0 (manual)")
  p.add_argument("--run", action="store_true", help="execute the tpu command")
  args, overrides = p.parse_known_args(argv)
  cmd = main_command(args.config, args.workdir, overrides, args.python)
  if args.target == "tpu":
    if not (args.tpu and args.zone):
      p.error("tpu needs --tpu and --zone")
    full = tpu_command(args.tpu, args.zone, args.repo_dir, cmd)
    print(shlex.join(full))
    if args.run:
      return subprocess.call(full)
  elif args.target == "slurm":
    sys.stdout.write(
        slurm_script(args.nodes, args.gpus_per_node, args.repo_dir, cmd)
    )
  else:
    if not args.coordinator:
      p.error("manual needs --coordinator=HOST:PORT")
    for c in manual_commands(args.nodes, args.coordinator, cmd):
      print(shlex.join(c))
  return 0


if __name__ == "__main__":
  sys.exit(main())
