#!/usr/bin/env bash
# Launcher of the DFlash drafter training job -- Pivot lab TEST DOUBLE of the user's run.sh.
#
#   ./run.sh [--nproc-per-node N] [trainer flags...]
#
# Like a typical hand-written run.sh it stays in the foreground as the PARENT of the
# trainer (bash -> python3 -u /opt/trainsim/train_dflash_pipeline.py, the shape of the user's
# `python3 -u /root/train_dflash_pipeline.py`, or bash -> torchrun agent -> workers)
# and exits with the trainer's status. It sets no traps: SIGTERM to this bash kills only
# the bash and leaves the trainer running, re-parented -- as with a real run.sh.
# Extra trainer flags can come from $TRAINSIM_ARGS (split on whitespace), so the script
# can be used unchanged; $TRAINSIM_NPROC_PER_NODE > 0 selects torchrun mode.
cd "$(dirname "$(readlink -f "$0")")" || exit 1

nproc="${TRAINSIM_NPROC_PER_NODE:-0}"
case "${1:-}" in
  --nproc-per-node=*) nproc="${1#*=}"; shift ;;
  --nproc-per-node) nproc="$2"; shift 2 ;;
esac

# shellcheck disable=SC2086  # TRAINSIM_ARGS carries several flags on purpose
if (( nproc > 0 )); then
  ./torchrun --nproc-per-node="$nproc" train_dflash_pipeline.py ${TRAINSIM_ARGS:-} "$@"
else
  python3 -u "$PWD/train_dflash_pipeline.py" ${TRAINSIM_ARGS:-} "$@"
fi
