#!/usr/bin/env bash
# Run one training command under Slurm with preemption handling; used by every *.sbatch here:
#
#   exec bash scripts/slurm/requeue.sh COMMAND [ARGS...]
#
# `exec` matters: with `#SBATCH --signal=B:USR1@120` Slurm signals only the batch shell, so this
# script must BE the batch shell. It starts COMMAND in the background, forwards USR1/TERM to it
# (the trainer checkpoints at the next step and exits 75), waits, and requeues the job when the
# command exited 75 or a signal arrived (torchrun/srun report their own codes instead of 75).
# The requeued job keeps its job id, hence its run_dir=, so `train` resumes from the checkpoint.
set -uo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: requeue.sh COMMAND [ARGS...]" >&2
    exit 2
fi

PREEMPT_EXIT_CODE=75
preempted=0
child=""

forward() {
    preempted=1
    echo "[requeue.sh] $(date -Is) received SIG$1: forwarding to pid ${child:-?}" >&2
    if [ -n "$child" ]; then
        kill -s "$1" "$child" 2>/dev/null || true
    fi
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

echo "[requeue.sh] $(date -Is) job ${SLURM_JOB_ID:-local} on $(hostname): $*" >&2
"$@" &
child=$!

rc=0
while :; do
    if wait "$child"; then rc=0; else rc=$?; fi
    # A trapped signal interrupts `wait` (status > 128) while the child still runs: wait again.
    if [ "$rc" -gt 128 ] && kill -0 "$child" 2>/dev/null; then
        continue
    fi
    break
done

if [ "$rc" -eq "$PREEMPT_EXIT_CODE" ] || [ "$preempted" -eq 1 ]; then
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        echo "[requeue.sh] $(date -Is) preempted (exit $rc): scontrol requeue $SLURM_JOB_ID" >&2
        # Fails harmlessly when Slurm already requeued a preempted job itself.
        scontrol requeue "$SLURM_JOB_ID" || true
    else
        echo "[requeue.sh] preempted (exit $rc) outside Slurm: rerun the same command to resume" >&2
    fi
    exit "$PREEMPT_EXIT_CODE"
fi
exit "$rc"
