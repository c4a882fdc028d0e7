#!/usr/bin/env bash
# Build the DDTree release venv for real on THIS machine with pivot.ops.release_venv: the controller's download of
# the release lock's wheels from PyPI (about 4 GiB), the ship, the offline install into a Python 3.12 venv, the CUDA
# extension build with this machine's nvcc, the self-check. Nothing here runs in CI (it needs PyPI, minutes and
# ~15 GiB of disk); it is how the 2026-12-04 build in docs/operations.md was made.
#   tests/manual/real_release_venv.sh WORK_DIR [COMPUTE_CAPABILITY]
# COMPUTE_CAPABILITY (e.g. 9.0) stands in for nvidia-smi's answer on a machine without a GPU; on a GPU host leave it
# out and the real nvidia-smi is asked. The venv goes to WORK_DIR/root/venvs/, the wheelhouse to WORK_DIR/wheelhouse.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mkdir -p "${1:?WORK_DIR}" && cd "$1" && pwd)
capability=${2:-}
python312=
for candidate in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
  [ -x "$candidate" ] && python312=$candidate
done
[ -n "$python312" ] || { echo "real_release_venv: need a Python 3.12 for the release venv" >&2; exit 1; }
if [ -n "$capability" ]; then
  mkdir -p "$work/bin"
  printf '#!/bin/sh\n# stand-in: the one query cuda_toolchain asks\necho %s\n' "$capability" > "$work/bin/nvidia-smi"
  chmod +x "$work/bin/nvidia-smi"
  export PATH="$work/bin:$PATH"
fi
cat > "$work/inventory.yml" <<YAML
serving:
  hosts:
    here:
      ansible_connection: local
      ansible_python_interpreter: $repo/.venv/bin/python
      pivot_release_python: $python312
      pivot_release_root: $work/root
      pivot_release_wheelhouse: $work/wheelhouse
      pivot_release_wheelhouse_lock: $repo/requirements/release-sglang-0.5.23-cp312.txt
      pivot_require_cuda_extension: true
YAML
cat > "$work/play.yml" <<YAML
---
- name: Build the DDTree release venv on this host
  hosts: serving
  gather_facts: false
  vars_files:
    - $repo/playbooks/vars/roles.yml
  tasks:
    - name: Build the release venv
      ansible.builtin.include_role:
        name: pivot.ops.release_venv
      vars:
        release_venv_source: $repo/ddtree_runtime
YAML
cd "$repo"
.venv/bin/ansible-playbook -i "$work/inventory.yml" "$work/play.yml"
cat "$work"/root/venvs/*/pivot-release.json
