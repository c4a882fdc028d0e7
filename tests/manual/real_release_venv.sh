#!/usr/bin/env bash
# Build the DDTree release venv for real on THIS machine with pivot.ops.release_venv: the controller's download of
# the release lock's wheels from PyPI (about 4 GiB; skipped when WORK_DIR/wheelhouse already holds them), the ship,
# the offline install into a Python 3.12 venv, the CUDA extension build with this machine's nvcc, the self-check;
# then the same play again, which must reuse the venv. Nothing here runs in CI (it needs PyPI or a carried
# wheelhouse, minutes and ~20 GiB of disk); it is how the builds in docs/operations.md were made.
#   tests/manual/real_release_venv.sh WORK_DIR [COMPUTE_CAPABILITY]
# COMPUTE_CAPABILITY (e.g. 9.0) stands in for nvidia-smi's answer on a machine without a GPU (the self-check then
# cannot require the GPU: pivot_release_require_gpu is false); on a GPU host leave it out and the real nvidia-smi is
# asked. The venv goes to WORK_DIR/root/venvs/, the wheelhouse to WORK_DIR/wheelhouse.
# PIVOT_ANSIBLE_VENV names the venv with ansible-core (default: the checkout's .venv, which lab/setup.sh makes);
# PIVOT_RELEASE_PYTHON the Python 3.12 the release venv is made from (default: pyenv's, /usr/bin's, then PATH's).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mkdir -p "${1:?WORK_DIR}" && cd "$1" && pwd)
capability=${2:-}
ansible_venv=${PIVOT_ANSIBLE_VENV:-$repo/.venv}
python312=${PIVOT_RELEASE_PYTHON:-}
if [ -z "$python312" ]; then
  for candidate in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    [ -x "$candidate" ] && python312=$candidate
  done
  [ -n "$python312" ] || python312=$(command -v python3.12 || true)
fi
[ -n "$python312" ] || { echo "real_release_venv: need a Python 3.12 for the release venv" >&2; exit 1; }
[ -x "$ansible_venv/bin/ansible-playbook" ] || {
  echo "real_release_venv: no ansible-playbook in $ansible_venv (run lab/setup.sh, or set PIVOT_ANSIBLE_VENV)" >&2
  exit 1
}
require_gpu=true
if [ -n "$capability" ]; then
  mkdir -p "$work/bin"
  printf '#!/bin/sh\n# stand-in: the one query cuda_toolchain asks\necho %s\n' "$capability" > "$work/bin/nvidia-smi"
  chmod +x "$work/bin/nvidia-smi"
  export PATH="$work/bin:$PATH"
  require_gpu=false
fi
# the checkout is the collection pivot.ops (as lab/setup.sh links it)
mkdir -p "$repo/.cache/collections/ansible_collections/pivot"
ln -sfn ../../../.. "$repo/.cache/collections/ansible_collections/pivot/ops"
cat > "$work/inventory.yml" <<YAML
serving:
  hosts:
    here:
      ansible_connection: local
      ansible_python_interpreter: $ansible_venv/bin/python
      pivot_release_python: $python312
      pivot_release_root: $work/root
      pivot_release_wheelhouse: $work/wheelhouse
      pivot_release_wheelhouse_lock: $repo/requirements/release-sglang-0.5.23-cp312.txt
      pivot_require_cuda_extension: true
      pivot_release_require_gpu: $require_gpu
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

    - name: Say what the role did
      ansible.builtin.debug:
        var: release_venv_findings
YAML
cd "$repo"
for run in build reuse; do
  start=$SECONDS
  "$ansible_venv/bin/ansible-playbook" -i "$work/inventory.yml" "$work/play.yml" | tee "$work/$run.log"
  echo "real_release_venv: $run run took $((SECONDS - start)) s"
done
grep -q '"built": false\|built: false' "$work/reuse.log" \
  || { echo "real_release_venv: the second run did not reuse the venv" >&2; exit 1; }
cat "$work"/root/venvs/*/pivot-release.json
