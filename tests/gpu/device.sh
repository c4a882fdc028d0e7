#!/usr/bin/env bash
# On the GPU machine (no network): put the carried SGLang bundle (tests/gpu/bundle.sh) in place, install
# ddtree_runtime beside it with the CUDA extension built against the bundle's torch, and run a command there.
#   tests/gpu/device.sh receive PIECE...   copy carried pieces into the bundle directory
#   tests/gpu/device.sh run CMD...          unpack once, (re)install ddtree_runtime, run CMD in that environment
#   tests/gpu/device.sh env CMD...          run CMD in the environment an earlier `run` prepared, installing nothing
#                                           (safe beside a running suite, whose servers load the installed plugin)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
root=${PIVOT_GPU_BUNDLE:-/tmp/pivot-gpu-bundle}
site=$root/site
bundle_environment() {
  # The cutlass DSL ships a .pth file; PYTHONPATH entries do not run .pth files, so its directory is named here.
  # The checkout comes first (its data files and the in-place extension); the install provides the entry point. The
  # lab's server (test equipment, not in ddtree_runtime) is there for the ddtree_runtime tests that start it.
  export PYTHONPATH=$repo/ddtree_runtime:$repo/lab/files/labserver:$root/ddtree:$site:$site/nvidia_cutlass_dsl/dsl_packages
  export PATH=$site/bin:$PATH
  # The test machine has no network: nothing may wait on the Hugging Face hub.
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
}

action=${1:?usage: device.sh receive PIECE... | run CMD... | env CMD...}
shift
case $action in
receive)
  mkdir -p "$root/pieces"
  for file in "$@"; do
    case $(basename "$file") in
      p[0-9]*) cp "$file" "$root/pieces/" ;;
      *) cp "$file" "$root/" ;;  # SHA256SUMS, the zstandard wheel for machines without the zstd tool
    esac
  done
  pieces=("$root"/pieces/p*)
  echo "${#pieces[@]} pieces"
  ;;
run)
  if [ ! -f "$site/.complete" ]; then
    cat "$root"/pieces/p* > "$root/site.tar.zst"
    (cd "$root" && sha256sum -c SHA256SUMS)
    rm -rf "$site" && mkdir -p "$site"
    if command -v zstd >/dev/null; then
      zstd -q -d --long=27 -c "$root/site.tar.zst" | tar -x -C "$site"
    else
      python3 -m pip install -q --no-deps --no-index --target "$root/zstd" "$root"/zstandard-*.whl
      PYTHONPATH=$root/zstd python3 -c 'import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=1 << 27).copy_stream(sys.stdin.buffer, sys.stdout.buffer)' \
        < "$root/site.tar.zst" | tar -x -C "$site"
    fi
    rm -f "$root/site.tar.zst"
    # Bytecode once, on every core: the wheels were installed with --no-compile, and on the 2026-12-02 run each
    # server process spent ~40 s before its first log line whatever had run before (nothing cached the bytecode).
    python3 -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
    touch "$site/.complete"
  fi
  # Wheels added to the bundle after it was carried (requirements/sglang-gpu.txt grew): carried in .bundle/extra.
  if compgen -G "$repo/.bundle/extra/*.whl" >/dev/null; then
    # Installed beside, then merged: pip --target --upgrade would replace whole top-level directories.
    rm -rf "$root/extra"
    python3 -m pip install -q --no-deps --no-index --target "$root/extra" "$repo"/.bundle/extra/*.whl
    cp -a "$root/extra/." "$site/"
  fi
  bundle_environment
  built=("$repo"/ddtree_runtime/ddtree_runtime/_C*.so)
  stamp=$(cat "$repo"/ddtree_runtime/csrc/* "$repo"/ddtree_runtime/setup.py | sha256sum | cut -c1-16)
  if [ ! -f "${built[0]}" ] || [ "$(cat "$repo/ddtree_runtime/.ext-stamp" 2>/dev/null)" != "$stamp" ]; then
    (cd "$repo/ddtree_runtime" && DDTREE_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 python3 setup.py -q build_ext --inplace)
    echo "$stamp" > "$repo/ddtree_runtime/.ext-stamp"
  fi
  rm -rf "$root/ddtree"
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$root/ddtree" "$repo/ddtree_runtime"
  cp "$repo"/ddtree_runtime/ddtree_runtime/_C*.so "$root/ddtree/ddtree_runtime/"
  exec "$@"
  ;;
env)
  if [ ! -f "$site/.complete" ] || [ ! -d "$root/ddtree" ]; then
    echo "device.sh env: no prepared bundle; use device.sh run first" >&2
    exit 2
  fi
  bundle_environment
  exec "$@"
  ;;
*) echo "device.sh: unknown action $action" >&2; exit 2 ;;
esac
