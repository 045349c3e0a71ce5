"""Assembles the commands that start a memjax run on many hosts.

Every host runs the same ``python -m memjax.main ... --multihost`` command
from the same checkout and virtual environment (``~/memjax/.venv`` on a TPU
VM; ``tpu_setup`` puts them on every worker);
``jax.distributed.initialize()`` then finds the coordinator from the TPU
metadata, from SLURM's variables, or from the explicit
``--coordinator_address/--num_processes/--process_id`` flags.

    # TPU pod slice: this checkout's committed tree, Python 3.11 and
    # `make venv ACCEL=tpu` on every worker, then the run (through gcloud):
    python launch/launch.py tpu_setup --tpu=my-v4-64 --zone=us-central2-b
    python launch/launch.py tpu --tpu=my-v4-64 --zone=us-central2-b \\
        --config=configs/trime_wt103.py:247m --workdir=gs://bucket/runs/247m
    # Multi-node GPU cluster with SLURM (prints an sbatch script):
    python launch/launch.py slurm --nodes=4 --gpus_per_node=8 \\
        --config=configs/trime_wt103.py:247m --workdir=/shared/runs/247m > run.sbatch
    # Any cluster without a scheduler: one command per node.
    python launch/launch.py manual --nodes=2 --coordinator=10.0.0.1:1234 \\
        --config=configs/trime_wt103.py:247m --workdir=/shared/runs/247m

Nothing is executed unless ``--run`` is given (tpu and tpu_setup); the
commands are printed so they can be checked, edited and kept with the
experiment.
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


# What every worker runs after the archive arrived: Python 3.11 beside the
# image's 3.10 (deadsnakes PPA) and make when missing, the tree unpacked into
# the repository directory, and its TPU virtual environment.
_WORKER_SETUP = (
    "set -e; need=; "
    'command -v python3.11 >/dev/null || need="python3.11 python3.11-venv"; '
    'command -v make >/dev/null || need="$need make"; '
    'if [ -n "$need" ]; then sudo add-apt-repository -y ppa:deadsnakes/ppa'
    " && sudo apt-get update -q && sudo apt-get install -y -q $need; fi; "
    "mkdir -p {repo_dir} && tar -xzf ~/{archive} -C {repo_dir} && rm ~/{archive}"
    " && cd {repo_dir} && make venv ACCEL=tpu PYTHON=python3.11"
)


def worker_setup(repo_dir: str, archive: str) -> str:
  """The shell command each worker runs to unpack ``~/<archive>`` into
  ``repo_dir`` (unquoted: ~ expands remotely) and make its venv."""
  return _WORKER_SETUP.format(repo_dir=repo_dir, archive=archive)


def tpu_setup_commands(
    tpu: str,
    zone: str,
    checkout: str,
    repo_dir: str,
    archive: str = "memjax.tar.gz",
    local_dir: str = "/tmp",
) -> list[list[str]]:
  """The commands that put ``checkout``'s committed tree (``git archive
  HEAD``: uncommitted changes stay behind) and its TPU venv on every worker
  of a TPU VM slice: archive it here, copy it to every worker, set each up.
  """
  local = f"{local_dir.rstrip('/')}/{archive}"
  gcloud = ["gcloud", "compute", "tpus", "tpu-vm"]
  where = [f"--zone={zone}", "--worker=all"]
  return [
      [
          "git",
          "-C",
          checkout,
          "archive",
          "--format=tar.gz",
          "-o",
          local,
          "HEAD",
      ],
      gcloud + ["scp", local, f"{tpu}:~/{archive}"] + where,
      gcloud
      + ["ssh", tpu]
      + where
      + [f"--command={worker_setup(repo_dir, archive)}"],
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
  p.add_argument("target", choices=["tpu", "tpu_setup", "slurm", "manual"])
  p.add_argument("--config")
  p.add_argument("--workdir")
  p.add_argument("--repo_dir", default="~/memjax")
  p.add_argument(
      "--checkout", default=".", help="the checkout tpu_setup copies (HEAD)"
  )
  p.add_argument("--python", default=".venv/bin/python")
  p.add_argument("--tpu")
  p.add_argument("--zone")
  p.add_argument("--nodes", type=int, default=1)
  p.add_argument("--gpus_per_node", type=int, default=8)
  p.add_argument("--coordinator", help="host:port of process 0 (manual)")
  p.add_argument("--run", action="store_true", help="execute the tpu commands")
  args, overrides = p.parse_known_args(argv)
  if args.target == "tpu_setup":
    if not (args.tpu and args.zone):
      p.error("tpu_setup needs --tpu and --zone")
    commands = tpu_setup_commands(
        args.tpu, args.zone, args.checkout, args.repo_dir
    )
    for command in commands:
      print(shlex.join(command))
      if args.run and subprocess.call(command):
        return 1
    return 0
  if not (args.config and args.workdir):
    p.error(f"{args.target} needs --config and --workdir")
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
