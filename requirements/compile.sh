#!/usr/bin/env bash
# Regenerates the locks from setup.py (run through `make locks`):
#   cpu.lock     the runtime: core + [data, beam, retrieval, cloud, pretrained],
#                CPU jaxlib
#   cuda12.lock  cpu.lock + jax[cuda12] (NVIDIA driver >= 525)
#   cuda13.lock  cpu.lock + jax[cuda13] (NVIDIA driver >= 580)
#   tpu.lock     cpu.lock + jax[tpu] (libtpu; TPU VMs)
#   dev.lock     the tests (with [pretrained]), formatter and notebooks
#                (install beside one above)
# Every lock is resolved against cpu.lock, so the shared packages agree
# (tests/test_locks.py checks it). Versions already pinned are kept; pass
# --upgrade to move everything to the newest versions that resolve.
set -euo pipefail
cd "$(dirname "$0")"
UV="${UV:-uv}"
compile() {  # compile <out> <platform> [uv args...]
  local out=$1 platform=$2
  shift 2
  "$UV" pip compile ../setup.py --python-version 3.11 \
    --python-platform "$platform" --no-header --no-annotate \
    -o "$out" "$@" "${EXTRA_ARGS[@]}"
}
EXTRA_ARGS=("$@")
RUNTIME=(--extra data --extra beam --extra retrieval --extra cloud
  --extra pretrained)
compile cpu.lock x86_64-manylinux_2_28 "${RUNTIME[@]}"
compile cuda12.lock x86_64-manylinux_2_28 "${RUNTIME[@]}" --extra cuda12 -c cpu.lock
compile cuda13.lock x86_64-manylinux_2_28 "${RUNTIME[@]}" --extra cuda13 -c cpu.lock
# libtpu's wheels are manylinux_2_31 (TPU VM images).
compile tpu.lock x86_64-manylinux_2_31 "${RUNTIME[@]}" --extra tpu -c cpu.lock
compile dev.lock x86_64-manylinux_2_28 --extra dev --extra pretrained \
  -c cpu.lock
