#!/usr/bin/env bash
# The user's NEXTN baseline unit judged by real SGLang 0.5.11 on a GPU machine, the way Pivot judges the recorded
# baseline before anything stops (roles/sglang_release/files/check_server_args.py, run with the baseline venv's
# python). On a CPU, 0.5.11's ServerArgs stops at "No accelerator ... is available" and, past that, at "Mamba
# extra_buffer is only supported on CUDA", so the whole judgement needs a GPU. The model is a config-only directory
# shaped like Qwen3.6-27B (the shipped hybrid target's files, its text_config scaled to 27B: 64 layers, hidden 5120,
# vocab 248320, 262144 positions, one MTP layer); the argv is the user's unit as the lab carries it
# (lab/files/sglang-nextn.service). The wheels (tests/gpu/sglang-0.5.11-parser.txt) go beside the GPU machine's own
# torch 2.11.0, 0.5.11's pin.
#   here:    tests/gpu/baseline_parser.sh pieces [OUT_DIR]   wheels for Python 3.12 and the model directory as tar
#                                                            pieces sized to travel beside the tree (default
#                                                            .release/sg511); carry each with one `receive` call
#   device:  tests/gpu/baseline_parser.sh receive PIECE...   move carried pieces aside
#            tests/gpu/baseline_parser.sh check              check and unpack, install (--target), judge the user's
#                                                            argv (must pass) and two it must refuse; logs to $OUT
# The pieces' calls and `check` go in one message, back to back: the machine goes cold after 30 s without a call.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
root=${PIVOT_BASELINE_PARSER_DIR:-/tmp/pivot-baseline-parser}
out=${OUT:-$root/out}
action=${1:?usage: baseline_parser.sh pieces [OUT_DIR] | receive PIECE... | check}
shift

user_argv() {  # the user's ExecStart after the launcher, the model path replaced
  sed -n 's#^ExecStart=/root/ml-env/bin/python3 -m sglang.launch_server ##p' "$repo/lab/files/sglang-nextn.service" \
    | sed "s#/root/models/Qwen3.6-27B#$1#"
}

judge() {  # EXPECTED_EXIT MESSAGE LABEL ARGS...: one check_server_args.py run, its stderr kept in $out; a refusal
  # (exit 2) counts only with SGLang's MESSAGE in it, since an SGLang that cannot even be imported exits 2 as well
  local expected=$1 message=$2 label=$3 code log
  shift 3
  log="$out/$(echo "$label" | tr -c 'a-zA-Z0-9\n' '-').log"
  PYTHONPATH=$root/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python3 \
    "$repo/roles/sglang_release/files/check_server_args.py" sglang.launch_server "$@" > "$root/result.json" 2> "$log"
  code=$?
  echo "$label: exit $code (expected $expected${message:+ saying \"$message\"})" \
    "$(cat "$root/result.json")$(grep -v -i warn "$log" | tail -n 1)"
  [ "$code" = "$expected" ] && { [ -z "$message" ] || grep -qF -- "$message" "$log"; }
}

make_model() {  # DIR: the shipped hybrid target's files without weights, its text_config at Qwen3.6-27B's size
  cp -r "$repo/ddtree_runtime/models/pivot-coder-tiny-hybrid" "$1" && rm -f "$1"/*.safetensors
  python3 - "$1/config.json" <<'PY'
import json, sys
path = sys.argv[1]
with open(path) as handle:
    config = json.load(handle)
config["text_config"].update(
    vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 16, num_attention_heads=24, num_key_value_heads=4,
    head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
    linear_value_head_dim=128, max_position_embeddings=262144, mtp_num_hidden_layers=1)
with open(path, "w") as handle:
    json.dump(config, handle, indent=1)
PY
}

case $action in
pieces)
  dest=${1:-$repo/.release/sg511}
  staging=$(mktemp -d) || exit 1
  trap 'rm -rf "$staging"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$staging/wheels" -r "$repo/tests/gpu/sglang-0.5.11-parser.txt" || exit 1
  make_model "$staging/model" || exit 1
  tree_bytes=$(cd "$repo" && git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)
  piece=$(( (64 << 20) - tree_bytes - (2 << 20) ))  # 64 MiB per call, the tree included, 2 MiB of margin
  rm -rf "$dest" && mkdir -p "$dest" || exit 1
  tar -cf - -C "$staging" wheels model | split -b "$piece" -d -a 3 - "$dest/p"
  (cd "$dest" && cat p[0-9]* | sha256sum | cut -d' ' -f1 > SHA256)
  echo "$(find "$dest" -name "p[0-9]*" | wc -l) pieces of $piece bytes in $dest; carry SHA256 with the first"
  ;;
receive)
  mkdir -p "$root/pieces"
  for file in "$@"; do
    case $(basename "$file") in
      SHA256) cp "$file" "$root/" ;;
      *) mv "$file" "$root/pieces/" ;;
    esac
  done
  echo "$(find "$root/pieces" -type f | wc -l) pieces"
  ;;
check)
  [ -f "$root/SHA256" ] || { echo "baseline_parser.sh: no SHA256 here (a fresh machine?): send the pieces again" >&2; exit 1; }
  [ "$(cd "$root/pieces" && cat p[0-9]* | sha256sum | cut -d' ' -f1)" = "$(cat "$root/SHA256")" ] \
    || { echo "baseline_parser.sh: the pieces do not add up ($(find "$root/pieces" -type f | wc -l) here)" >&2; exit 1; }
  rm -rf "$root/unpacked" "$root/site" && mkdir -p "$root/unpacked" "$out" || exit 1
  (cd "$root/pieces" && cat p[0-9]*) | tar -x -C "$root/unpacked" || exit 1
  python3 -m pip install -q --no-index --no-deps --target "$root/site" "$root"/unpacked/wheels/*.whl || exit 1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "sees a GPU:", torch.cuda.is_available())'
  model=$root/unpacked/model
  read -ra argv <<< "$(user_argv "$model")"
  failed=0
  judge 0 "" "the user's unit" "${argv[@]}" || failed=1
  judge 2 "unrecognized arguments: --mamba-radix-cache-strategy" "0.5.23's name for the mamba option" \
    "${argv[@]/--mamba-scheduler-strategy/--mamba-radix-cache-strategy}" || failed=1
  judge 2 "invalid choice: 'DDTREE'" "DDTREE, which 0.5.11 does not know" --model-path "$model" \
    --speculative-algorithm DDTREE --speculative-draft-model-path "$model" || failed=1
  exit $failed
  ;;
*) echo "baseline_parser.sh: unknown action $action" >&2; exit 2 ;;
esac
