#!/usr/bin/env bash
# Writes an sbatch script for a multi-node GPU run and submits it.
# Usage: launch/gpu_slurm.sh NODES GPUS_PER_NODE CONFIG WORKDIR [--config.key=value ...]
set -euo pipefail
nodes=$1 gpus=$2 config=$3 workdir=$4; shift 4
script=$(mktemp --suffix=.sbatch)
python3 "$(dirname "$0")/launch.py" slurm --nodes="$nodes" --gpus_per_node="$gpus" \
  --repo_dir="$(cd "$(dirname "$0")/.." && pwd)" --config="$config" --workdir="$workdir" "$@" > "$script"
echo "sbatch script: $script"
exec sbatch "$script"
