#!/usr/bin/env bash
# Submit the whole chain with --dependency=afterok and print one "STEP JOBID" line per job:
#
#   preprocess (array) -> check -> stage0 -> stage1 -> probe (array) -> merge -> export
#
# Usage:  ECGPOS_SRC=... ECGPOS_DATA_ROOT=... slurm/pipeline.sh          (or: set -a; . my.env; slurm/pipeline.sh)
# Every setting is an environment variable with a default; see slurm/env.example. ECGPOS_STEPS picks a
# contiguous part of the chain (e.g. "stage1 probe merge export" when the shards and Stage 0 exist).
# A failed job cancels everything that depends on it (--kill-on-invalid-dep=yes).
# ECGPOS_DRY_RUN=1 prints the sbatch command lines (prefixed with "#") instead of submitting.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm/common.sh
. "$HERE/common.sh"

: "${ECGPOS_STEPS:=preprocess check stage0 stage1 probe merge export}"
: "${ECGPOS_LOG_DIR:=$PWD/logs}"
: "${ECGPOS_NODES:=1}"
: "${ECGPOS_PREPROCESS_PARTS:=4}"
: "${ECGPOS_PREPROCESS_CPUS:=4}"
: "${ECGPOS_PREPROCESS_TIME:=12:00:00}"
: "${ECGPOS_PRETRAIN_CPUS:=8}"
: "${ECGPOS_PRETRAIN_TIME:=48:00:00}"
: "${ECGPOS_SIGNAL_SECONDS:=300}"
: "${ECGPOS_PROBE_CPUS:=4}"
: "${ECGPOS_PROBE_TIME:=12:00:00}"
: "${ECGPOS_PROBE_GPUS:=$(( ECGPOS_GPUS_PER_NODE > 0 ? 1 : 0 ))}"
: "${ECGPOS_PROBE_TASKS:=ptbxl-super ptbxl-sub ptbxl-form ptbxl-rhythm cpsc2018}"
export ECGPOS_PROBE_TASKS ECGPOS_SHARDS ECGPOS_RUNS ECGPOS_PROBES ECGPOS_EXPORT HDF5_USE_FILE_LOCKING

wants() { [[ " $ECGPOS_STEPS " == *" $1 "* ]]; }
if wants preprocess; then [ -n "${ECGPOS_SRC:-}" ] || ecgpos_die "set ECGPOS_SRC (raw pretraining corpus)"; fi
if wants probe; then [ -n "${ECGPOS_DATA_ROOT:-}" ] || ecgpos_die "set ECGPOS_DATA_ROOT (ptbxl/ + cpsc2018/)"; fi
[ "$ECGPOS_DRY_RUN" = 1 ] || command -v sbatch >/dev/null || ecgpos_die "sbatch not found: run this on a Slurm login node"
[ "$ECGPOS_DRY_RUN" = 1 ] || mkdir -p "$ECGPOS_LOG_DIR" "$ECGPOS_WORK"   # sbatch cannot create the log folder

# Options every job gets: where to log, where to run, and the site's account / partition / qos if given.
common=(--parsable --kill-on-invalid-dep=yes --chdir="$PWD" --export=ALL)
[ -n "${ECGPOS_PARTITION:-}" ] && common+=(--partition="$ECGPOS_PARTITION")
[ -n "${ECGPOS_ACCOUNT:-}" ] && common+=(--account="$ECGPOS_ACCOUNT")
[ -n "${ECGPOS_QOS:-}" ] && common+=(--qos="$ECGPOS_QOS")
# shellcheck disable=SC2206  # a list of extra arguments
common+=(${ECGPOS_SBATCH_ARGS:-})
log_single=(--output="$ECGPOS_LOG_DIR/%x-%j.out")
log_array=(--output="$ECGPOS_LOG_DIR/%x-%A_%a.out")
gres() { if [ "$1" -gt 0 ]; then echo "--gres=gpu:$1"; fi; }

prev=""
submit() {  # submit STEP SBATCH-ARGS... ; chains on the previous job and prints "STEP JOBID"
    local step=$1 id dep=()
    shift
    [ -n "$prev" ] && dep=(--dependency="afterok:$prev")
    if [ "$ECGPOS_DRY_RUN" = 1 ]; then   # print what would be submitted; fake ids keep the chain readable
        echo "# $(printf '%q ' sbatch "${common[@]}" "${dep[@]}" "$@")"
        id="<$step>"
    else
        id=$(sbatch "${common[@]}" "${dep[@]}" "$@")
        id=${id%%;*}   # --parsable prints "id;cluster" on multi-cluster sites
    fi
    echo "$step $id"
    prev=$id
}

if wants preprocess; then
    submit preprocess --job-name=ecgpos-preprocess "${log_array[@]}" --array="0-$(( ECGPOS_PREPROCESS_PARTS - 1 ))" \
        --cpus-per-task="$ECGPOS_PREPROCESS_CPUS" --time="$ECGPOS_PREPROCESS_TIME" "$HERE/preprocess.sbatch"
fi
if wants check; then
    submit check --job-name=ecgpos-preprocess-check "${log_single[@]}" --cpus-per-task=1 --time=01:00:00 \
        "$HERE/preprocess.sbatch" check
fi
for stage in 0 1; do
    if wants "stage$stage"; then
        # shellcheck disable=SC2046  # gres() prints nothing or one word
        submit "stage$stage" --job-name="ecgpos-stage$stage" "${log_single[@]}" --nodes="$ECGPOS_NODES" \
            --ntasks-per-node=1 --cpus-per-task="$ECGPOS_PRETRAIN_CPUS" --time="$ECGPOS_PRETRAIN_TIME" \
            --signal="B:USR1@$ECGPOS_SIGNAL_SECONDS" --requeue $(gres "$ECGPOS_GPUS_PER_NODE") \
            "$HERE/pretrain.sbatch" "$stage"
    fi
done
read -r -a _tasks <<< "$ECGPOS_PROBE_TASKS"
if wants probe; then
    # shellcheck disable=SC2046
    submit probe --job-name=ecgpos-probe "${log_array[@]}" --array="0-$(( ${#_tasks[@]} - 1 ))" \
        --cpus-per-task="$ECGPOS_PROBE_CPUS" --time="$ECGPOS_PROBE_TIME" $(gres "$ECGPOS_PROBE_GPUS") \
        "$HERE/probe.sbatch"
fi
if wants merge; then
    submit merge --job-name=ecgpos-probe-merge "${log_single[@]}" --cpus-per-task=1 --time=01:00:00 \
        "$HERE/probe.sbatch" merge
fi
if wants export; then
    submit export --job-name=ecgpos-export "${log_single[@]}" --cpus-per-task=1 --time=01:00:00 \
        "$HERE/export.sbatch"
fi
