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
# The locks are resolved for the oldest Python memjax supports (OLDEST) and
# must install unchanged on the others (NEWER, up to setup.py's
# python_requires): each is resolved again against them, and a pin that
# has no release for it stops this script.
set -euo pipefail
cd "$(dirname "$0")"
UV="${UV:-uv}"
OLDEST=3.11
NEWER=(3.12 3.13)
compile() {  # compile <out> <platform> [uv args...]
  local out=$1 platform=$2
  shift 2
  "$UV" pip compile ../setup.py --python-version "$OLDEST" \
    --python-platform "$platform" --no-header --no-annotate \
    -o "$out" "$@" "${EXTRA_ARGS[@]}"
}
same_on_newer() {  # same_on_newer <lock> <platform> [uv args...]
  local lock=$1 platform=$2 version out
  shift 2
  out=$(mktemp)
  for version in "${NEWER[@]}"; do
    "$UV" pip compile ../setup.py --python-version "$version" \
      --python-platform "$platform" --no-header --no-annotate -q \
      -c "$lock" -o "$out" "$@"
    diff -q "$out" "$lock" >/dev/null || {
      echo "compile.sh: $lock does not install unchanged on Python $version" >&2
      diff "$out" "$lock" >&2
      exit 1
    }
  done
  rm -f "$out"
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
same_on_newer cpu.lock x86_64-manylinux_2_28 "${RUNTIME[@]}"
same_on_newer cuda12.lock x86_64-manylinux_2_28 "${RUNTIME[@]}" --extra cuda12
same_on_newer cuda13.lock x86_64-manylinux_2_28 "${RUNTIME[@]}" --extra cuda13
same_on_newer tpu.lock x86_64-manylinux_2_31 "${RUNTIME[@]}" --extra tpu
same_on_newer dev.lock x86_64-manylinux_2_28 --extra dev --extra pretrained
