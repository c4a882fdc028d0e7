#!/usr/bin/env bash
# The release venv built for real on a GPU machine without network, by the role itself
# (tests/manual/real_release_venv.sh: pivot.ops.release_venv with a local connection, then a second run that must
# reuse the venv), from the release wheelhouse carried in pieces.
#   here:    tests/gpu/release_venv.sh pieces WHEELHOUSE [OUT_DIR]  the wheelhouse (wheelhouse.py build) as tar pieces
#                                                                    sized to travel beside the tree, plus ansible-core's
#                                                                    wheels for Python 3.12 (default OUT_DIR .release)
#   device:  tests/gpu/release_venv.sh setup                        a venv with ansible-core from OUT_DIR/ansible
#            tests/gpu/release_venv.sh receive PIECE...             move carried pieces aside (one device call each)
#            tests/gpu/release_venv.sh start WAIT                   check and unpack the wheelhouse, start the build in
#                                                                    the background, wait up to WAIT s, collect to $OUT
#            tests/gpu/release_venv.sh wait WAIT                    wait for it again, collect
# A device call that finds no machine costs device time too: send `setup` alone, and the pieces only once it answered.
# The machine goes cold after 30 s without a call (composing the receive calls can take longer): if `start` says setup
# is missing, send `setup` again (it keeps the pieces received), then `start` and its `wait` calls in one message, back
# to back, since the run takes longer than one call may. `wait` on a machine that has no run says so at once.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
root=${PIVOT_RELEASE_GPU_DIR:-/tmp/pivot-release-gpu}
out=${OUT:-$root/out}
action=${1:?usage: release_venv.sh pieces WHEELHOUSE [OUT_DIR] | setup | receive PIECE... | start WAIT | wait WAIT}
shift
# ansible-core as the controller pins it; its own dependencies at the versions the controller venv resolved
ansible_pins=("$(grep -m1 '^ansible-core==' "$repo/requirements/controller.txt")" cffi==2.1.1 cryptography==51.0.1 Jinja2==3.1.6 MarkupSafe==3.0.4 packaging==26.4
              pycparser==3.12 PyYAML==6.0.4 resolvelib==1.2.1)

collect() {
  mkdir -p "$out"
  cp "$root/run.log" "$out/" 2>/dev/null
  cp "$root"/work/root/venvs/*/pivot-release.json "$out/" 2>/dev/null
  (cd "$root/work" && tar -czf "$out/logs.tgz" ./*.log ./inventory.yml 2>/dev/null)
  grep -E "took|fatal|FAILED!" "$root/run.log" | tail -n 8
  tail -n 4 "$root/run.log"
  if [ -f "$root/exit_code" ]; then cat "$root/exit_code"
  elif kill -0 "$(cat "$root/pid")" 2>/dev/null; then echo "still running"
  else echo "the run ended without an exit code"; fi
}

wait_for() {
  local deadline=$((SECONDS + $1))
  while [ ! -f "$root/exit_code" ] && [ $SECONDS -lt $deadline ] && kill -0 "$(cat "$root/pid")" 2>/dev/null; do
    sleep 5
  done
  collect
}

case $action in
pieces)
  wheelhouse=$(cd "${1:?WHEELHOUSE}" && pwd)
  dest=${2:-$repo/.release}
  [ -f "$wheelhouse/requirements.txt" ] || { echo "release_venv.sh: $wheelhouse is not a release wheelhouse" >&2; exit 1; }
  tree_bytes=$(cd "$repo" && git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)
  # 64 MiB travel per call, the tree included; 2 MiB of margin for the tree growing between here and the calls
  piece=$(( (64 << 20) - tree_bytes - (2 << 20) ))
  rm -rf "$dest" && mkdir -p "$dest/ansible"
  tar -cf - -C "$wheelhouse" . | split -b "$piece" -d -a 3 - "$dest/p"
  (cd "$dest" && cat p[0-9]* | sha256sum | cut -d' ' -f1 > SHA256)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$dest/ansible" "${ansible_pins[@]}" || exit 1
  cp "$wheelhouse"/pip-*.whl "$dest/ansible/"
  echo "$(find "$dest" -maxdepth 1 -name "p[0-9]*" | wc -l) pieces of $piece bytes in $dest;" \
    "carry $dest/ansible and $dest/SHA256 with setup"
  ;;
setup)
  src=${1:-$repo/.release}
  python3.12 -m venv --without-pip "$root/ansible" || exit 1
  "$root/ansible/bin/python" "$(ls "$src"/ansible/pip-*.whl)/pip" install -q --no-index "$src"/ansible/*.whl || exit 1
  mkdir -p "$root/pieces" && cp "$src/SHA256" "$root/"
  "$root/ansible/bin/ansible-playbook" --version | head -n 1
  nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  command -v nvcc && nvcc --version | tail -n 1
  ;;
receive)
  mkdir -p "$root/pieces"
  mv "$@" "$root/pieces/" && echo "$(find "$root/pieces" -type f | wc -l) pieces"
  ;;
start)
  # a machine that went cold after setup keeps the pieces received since but has neither the venv nor the checksum
  if [ ! -x "$root/ansible/bin/ansible-playbook" ] || [ ! -f "$root/SHA256" ]; then
    echo "release_venv.sh: setup is missing on this machine (it went cold after setup?): send setup again," \
      "carrying .release/ansible and .release/SHA256; it keeps the pieces already received" >&2
    exit 1
  fi
  [ "$(cd "$root/pieces" && cat p[0-9]* | sha256sum | cut -d' ' -f1)" = "$(cat "$root/SHA256")" ] \
    || { echo "release_venv.sh: the pieces do not add up to the packed wheelhouse (one missing?): compare" \
              "$(find "$root/pieces" -type f | wc -l) received with the pieces made here" >&2; exit 1; }
  rm -rf "$root/work" "$root/exit_code" "$root/pid" && mkdir -p "$root/work/wheelhouse"
  (cd "$root/pieces" && cat p[0-9]*) | tar -x -C "$root/work/wheelhouse" || exit 1
  rm -rf "$root/pieces"
  echo "wheelhouse: $(find "$root/work/wheelhouse" -type f | wc -l) files"
  # no network here: nothing may wait on the Hugging Face hub (the self-check's server start builds its own models)
  export PIVOT_ANSIBLE_VENV=$root/ansible HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  # shellcheck disable=SC2016  # expanded by the inner bash
  setsid nohup bash -c '"$0" "$1"; echo $? > "$2"' "$repo/tests/manual/real_release_venv.sh" "$root/work" \
    "$root/exit_code" > "$root/run.log" 2>&1 < /dev/null &
  echo $! > "$root/pid"
  wait_for "${1:?WAIT}"
  ;;
wait)
  [ -f "$root/pid" ] || { echo "release_venv.sh: no run was started on this machine (a fresh one?): start over" \
    "with setup" >&2; exit 3; }
  wait_for "${1:?WAIT}"
  ;;
*) echo "release_venv.sh: unknown action $action" >&2; exit 2 ;;
esac
