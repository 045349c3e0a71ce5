#!/usr/bin/env bash
# Starts a run on every worker of a TPU VM slice.
# Usage: launch/tpu_pod.sh TPU_NAME ZONE CONFIG WORKDIR [--config.key=value ...]
set -euo pipefail
tpu=$1 zone=$2 config=$3 workdir=$4; shift 4
exec python3 "$(dirname "$0")/launch.py" tpu --tpu="$tpu" --zone="$zone" \
  --config="$config" --workdir="$workdir" --run "$@"
