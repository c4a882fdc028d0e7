#!/usr/bin/env bash
# Build, on a machine with PyPI, the SGLang bundle the GPU acceptance suite needs on a GPU machine without network:
# the cp312 wheels of requirements/sglang-gpu.txt installed into one directory, pruned of what the suite does not
# load, packed with zstd and cut into pieces small enough to travel one per device call.
#   tests/gpu/bundle.sh [OUT_DIR] [PIECE_SIZE]    (default .bundle, 46M)
# Writes OUT_DIR/pNN pieces, OUT_DIR/SHA256SUMS (of the packed archive) and OUT_DIR/LEFT_OUT (what was pruned, why).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$repo/.bundle}
piece=${2:-46M}
work=$repo/.cache/gpu-bundle
# pyenv's own interpreter, not its shim (a shim follows whatever `pyenv global` says)
python=
for candidate in "$HOME"/.pyenv/versions/3.12*/bin/python3 /usr/bin/python3.12; do
  [ -x "$candidate" ] && python=$candidate
done
[ -n "$python" ] || { echo "bundle: need a Python 3.12 (pip installs the cp312 wheels with it)" >&2; exit 1; }
mkdir -p "$work/wheels" "$out"
platforms=()
for n in 5 12 17 18 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d "$work/wheels" -r "$repo/requirements/sglang-gpu.txt"
rm -rf "$work/site"
"$python" -m pip install -q --no-deps --no-compile --no-cache-dir --target "$work/site" "$work"/wheels/*.whl
cat > "$out/LEFT_OUT" <<'TXT'
sglang-kernel flash_ops.abi3.so (FA3, 1.1 GB): the suite serves with --attention-backend triton
sglang-kernel sm100/ kernels: Blackwell datacenter parts only
TXT
rm -rf "$work/site/sgl_kernel/flash_ops.abi3.so" "$work/site/sgl_kernel/sm100"
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$out"/p[0-9]*
tar -cf - -C "$work/site" . | zstd -q -T0 -12 --long=27 -o "$work/site.tar.zst" -f
(cd "$work" && sha256sum site.tar.zst) > "$out/SHA256SUMS"
split -b "$piece" -d -a 2 "$work/site.tar.zst" "$out/p"
ls "$out"
