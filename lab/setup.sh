#!/usr/bin/env bash
# Installs everything Pivot's lab and test suite need on a fresh Debian 12 machine (as root):
# Debian packages, the controller venv (.venv, Python >= 3.12) and the ddtree_runtime venv
# (.venv-rt, CPython 3.11) and the SGLang contract venv (.venv-sglang, CPython 3.11). Safe to re-run: each step is skipped when already done.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: the lab creates network namespaces, mounts and containers."

apt_packages=(openssh-server openssh-client systemd-container mmdebstrap iproute2 zstd shellcheck)

install_debian_packages() {
  local missing=()
  for p in "${apt_packages[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

pyenv_root() { command -v pyenv >/dev/null 2>&1 && pyenv root || echo "${PYENV_ROOT:-$HOME/.pyenv}"; }

# Newest interpreter matching a major.minor pattern: pyenv's builds first, then PATH.
find_python() {
  local want=$1 candidates=() c
  for c in "$(pyenv_root)"/versions/*/bin/python3; do [ -x "$c" ] && candidates+=("$c"); done
  for c in python3.13 python3.12 python3.11 python3; do command -v "$c" >/dev/null 2>&1 && candidates+=("$(command -v "$c")"); done
  for c in "${candidates[@]}"; do
    local v
    v=$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
    if [[ "$v" =~ ^${want}$ ]]; then echo "$v $c"; fi
  done | sort -s -t. -k2,2nr | sed -n '1s/^[^ ]* //p'
}

# make_venv DIR PYTHON REQUIREMENTS: (re)creates DIR when the requirements file changed.
make_venv() {
  local dir=$1 py=$2 req=$3 stamp
  stamp=$(sha256sum "$req" | cut -c1-16)
  if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.pivot-stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  say "creating $dir with $py from $req"
  rm -rf "$dir"
  "$py" -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check -r "$req" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
  "$dir/bin/python" -c 'import sys' && echo "$stamp" > "$dir/.pivot-stamp"
}

controller_venv() {
  local py
  py=$(find_python '3\.(1[2-9])')
  [ -n "$py" ] || die "no Python >= 3.12 found (looked in $(pyenv_root)/versions and on PATH).
ansible-core 2.21 needs Python >= 3.12; on Python 3.11 pip would silently install ansible-core 2.19.
Install one, e.g. 'pyenv install 3.13', and run this again."
  make_venv .venv "$py" requirements/controller.txt
  # Read the whole output before matching: a reader that stops early (head, grep -q) makes
  # ansible die of a broken pipe and, under pipefail, fails a good venv.
  local version
  version=$(.venv/bin/ansible --version) || die ".venv/bin/ansible --version failed (output above)"
  [[ "${version%%$'\n'*}" == *"core 2.21"* ]] || die ".venv does not have ansible-core 2.21 (it says: ${version%%$'\n'*})"
  # ansible finds this checkout as the collection pivot.ops through .cache/collections.
  mkdir -p .cache/collections/ansible_collections/pivot
  ln -sfn ../../../.. .cache/collections/ansible_collections/pivot/ops
  # molecule copies collections into ~/.ansible/collections; a stale copy would shadow this checkout.
  rm -rf "$HOME/.ansible/collections/ansible_collections/pivot/ops"
  # ansible-test bootstraps pip with a script it downloads; offline, ensurepip does the same job.
  local shim_dir="$HOME/.ansible/test/cache"
  mkdir -p "$shim_dir"
  install -m 0644 tests/support/get_pip_shim.py "$shim_dir/get_pip_25_2.py"
}

runtime_venv() {
  local py
  py=$(find_python '3\.11')
  [ -n "$py" ] || die "no CPython 3.11 found: ddtree_runtime's tests (and SGLang wheels) need 3.11."
  make_venv .venv-rt "$py" requirements/runtime-dev.txt
  # ddtree_runtime, and the lab's server its tests start (test equipment: its own distribution, lab/files/labserver),
  # both editable, so the tests always see the checkout.
  if [ -f ddtree_runtime/pyproject.toml ]; then
    local stamp
    stamp=$(cat ddtree_runtime/pyproject.toml lab/files/labserver/pyproject.toml | sha256sum | cut -c1-16)
    if [ "$(cat .venv-rt/.pivot-ddtree 2>/dev/null)" != "$stamp" ]; then
      say "installing ddtree_runtime and the lab's server (editable) into .venv-rt"
      .venv-rt/bin/pip install -q --no-deps --no-build-isolation -e ./ddtree_runtime -e ./lab/files/labserver 2>&1 \
        | grep -v "is ignored: it is neither" >&2 || true
      .venv-rt/bin/python -c 'import ddtree_runtime, pivot_labserver' \
        || die ".venv-rt cannot import ddtree_runtime or pivot_labserver"
      echo "$stamp" > .venv-rt/.pivot-ddtree
    fi
  fi
}

# .venv-sglang: stock SGLang 0.5.23 on CPU for the plugin's contract tests (tests/contract). The pinned list is
# complete, so it goes in with --no-deps; sglang itself with --no-deps too (its pins are CUDA kernels);
# ddtree_runtime editable, so the tests always see the checkout (the stamp covers its entry points).
sglang_version=0.5.23
sglang_venv() {
  local py stamp
  py=$(find_python '3\.11')
  [ -n "$py" ] || die "no CPython 3.11 found: SGLang $sglang_version wheels are cp311 only."
  stamp=$({ cat requirements/sglang-contract.txt; echo "sglang==$sglang_version"; cat ddtree_runtime/pyproject.toml; } | sha256sum | cut -c1-16)
  if [ -x .venv-sglang/bin/python ] && [ "$(cat .venv-sglang/.pivot-stamp 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  say "creating .venv-sglang with $py (SGLang $sglang_version, CPU; a few minutes)"
  rm -rf .venv-sglang
  "$py" -m venv .venv-sglang
  local pip=(.venv-sglang/bin/pip install -q --disable-pip-version-check --no-deps)
  { "${pip[@]}" -r requirements/sglang-contract.txt
    "${pip[@]}" "sglang==$sglang_version"
    "${pip[@]}" --no-build-isolation -e ./ddtree_runtime
  } 2>&1 | grep -v "is ignored: it is neither" >&2 || true
  .venv-sglang/bin/python -c 'import sglang.srt.server_args, ddtree_runtime.sglang' \
    || die ".venv-sglang cannot import SGLang or ddtree_runtime.sglang"
  echo "$stamp" > .venv-sglang/.pivot-stamp
}

# The venvs are independent of each other: build them at once (pip mostly waits on the network and the disk).
build_venvs() {
  local steps=("$@") pids=() failed=() i
  for i in "${!steps[@]}"; do "${steps[$i]}" & pids[i]=$!; done
  for i in "${!steps[@]}"; do wait "${pids[$i]}" || failed+=("${steps[$i]}"); done
  [ ${#failed[@]} -eq 0 ] || die "set-up failed in: ${failed[*]} (its messages are above)"
}

what=${1:-all}
case "$what" in
  debian) install_debian_packages ;;
  controller) controller_venv ;;
  runtime) runtime_venv ;;
  sglang) sglang_venv ;;
  lab) install_debian_packages; build_venvs controller_venv runtime_venv ;;
  all) install_debian_packages; build_venvs controller_venv runtime_venv sglang_venv ;;
  *) die "usage: lab/setup.sh [all|lab|debian|controller|runtime|sglang]" ;;
esac
