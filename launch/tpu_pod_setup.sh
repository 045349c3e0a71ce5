#!/usr/bin/env bash
# Puts this checkout's committed tree (git archive HEAD), Python 3.11 and its
# TPU virtual environment (make venv ACCEL=tpu) in ~/memjax on every worker
# of a TPU VM slice; then launch/tpu_pod.sh starts a run there.
# Usage: launch/tpu_pod_setup.sh TPU_NAME ZONE
set -euo pipefail
tpu=$1 zone=$2
here="$(dirname "$0")"
exec python3 "$here/launch.py" tpu_setup --tpu="$tpu" --zone="$zone" \
  --checkout="$here/.." --run
