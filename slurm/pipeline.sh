#!/usr/bin/env bash
# Submit the whole chain with --dependency=afterok and print one "STEP JOBID" line per job:
#
#   preprocess (array) -> check -> stage0 -> stage1 -> probe (array) -> merge -> export
#
# Usage:  ECGPOS_SRC=... ECGPOS_DATA_ROOT=... slurm/pipeline.sh          (or: set -a; . my.env; slurm/pipeline.sh)
# Every setting is an environment variable with a default; see slurm/env.example. ECGPOS_STEPS picks a
# contiguous part of the chain (e.g. "stage1 probe merge export" when the shards and Stage 0 exist).
# Settings are checked before anything is submitted (one line naming the variable, exit 2); a submission
# that sbatch refuses cancels the jobs submitted before it. A failed job cancels everything that depends on
# it (--kill-on-invalid-dep=yes).
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
ecgpos_require_int ECGPOS_GPUS_PER_NODE 0
: "${ECGPOS_PROBE_GPUS:=$(( ECGPOS_GPUS_PER_NODE > 0 ? 1 : 0 ))}"
: "${ECGPOS_PROBE_TASKS:=ptbxl-super ptbxl-sub ptbxl-form ptbxl-rhythm cpsc2018}"
export ECGPOS_PROBE_TASKS ECGPOS_SHARDS ECGPOS_RUNS ECGPOS_PROBES ECGPOS_EXPORT HDF5_USE_FILE_LOCKING

# --- settings are checked here, before anything is submitted: one line naming the variable, exit 2 ---------
STEPS="preprocess check stage0 stage1 probe merge export"
read -r -a _steps <<< "$ECGPOS_STEPS"
[ "${#_steps[@]}" -gt 0 ] || ecgpos_die "ECGPOS_STEPS is empty (steps: $STEPS)"
for _s in "${_steps[@]}"; do
    [[ " $STEPS " == *" $_s "* ]] || ecgpos_die "ECGPOS_STEPS: unknown step '$_s' (steps: $STEPS)"
done
wants() { [[ " $ECGPOS_STEPS " == *" $1 "* ]]; }
for _v in ECGPOS_NODES:1 ECGPOS_PREPROCESS_PARTS:1 ECGPOS_PREPROCESS_CPUS:1 ECGPOS_PRETRAIN_CPUS:1 \
          ECGPOS_SIGNAL_SECONDS:1 ECGPOS_PROBE_CPUS:1 ECGPOS_PROBE_GPUS:0; do
    ecgpos_require_int "${_v%:*}" "${_v#*:}"
done
[ -z "${ECGPOS_MAX_REQUEUES:-}" ] || ecgpos_require_int ECGPOS_MAX_REQUEUES 0
# the lists the jobs split (an unclosed quote would fail each job in turn, hours later in the queue)
for _v in ECGPOS_SBATCH_ARGS ECGPOS_PRETRAIN_SET ECGPOS_PROBE_TASKS ECGPOS_PREPROCESS_ARGS ECGPOS_PROBE_ARGS \
          ECGPOS_EXPORT_ARGS; do
    ecgpos_words "$_v" _words
done
ecgpos_require_setup
if wants preprocess; then ecgpos_require_dir ECGPOS_SRC "raw pretraining corpus"; fi
if { wants stage0 || wants stage1; } && ! wants preprocess && [ ! -f "$ECGPOS_SHARDS/index.csv" ]; then
    ecgpos_die "ECGPOS_SHARDS=$ECGPOS_SHARDS has no index.csv: add preprocess to ECGPOS_STEPS or set ECGPOS_SHARDS"
fi
if wants stage0; then ecgpos_require_config ECGPOS_STAGE0_CONFIG; fi
if wants stage1; then
    ecgpos_require_config ECGPOS_STAGE1_CONFIG
    if ! wants stage0; then
        ECGPOS_STAGE0_RUN=${ECGPOS_STAGE0_RUN:-$ECGPOS_RUNS/stage0}
        ecgpos_require_dir ECGPOS_STAGE0_RUN "Stage 1's Stage-0 run or export; add stage0 to ECGPOS_STEPS"
    fi
fi
if wants probe; then
    ecgpos_require_dir ECGPOS_DATA_ROOT "the folder holding ptbxl/ and cpsc2018/"
    ECGPOS_SPLITS=${ECGPOS_SPLITS:-$ECGPOS_DATA_ROOT/merl_splits}
    ecgpos_require_dir ECGPOS_SPLITS "MERL's split folders"
    ecgpos_require_probe_tasks
    if ! wants stage1 && [[ ${ECGPOS_PROBE_ENCODER:-} != random:* ]]; then
        ECGPOS_PROBE_ENCODER=${ECGPOS_PROBE_ENCODER:-$ECGPOS_RUNS/stage1}
        ecgpos_require_dir ECGPOS_PROBE_ENCODER "the encoder to probe; add stage1 to ECGPOS_STEPS"
    fi
fi
if wants export && ! wants stage1; then
    ECGPOS_EXPORT_RUN=${ECGPOS_EXPORT_RUN:-$ECGPOS_RUNS/stage1}
    ecgpos_require_dir ECGPOS_EXPORT_RUN "the run to export; add stage1 to ECGPOS_STEPS"
fi
# Last, as it imports ecgpos: each stage's config with the overrides, resolved as its job will resolve it.
for _stage in 0 1; do
    if wants "stage$_stage" && ! ecgpos_check_pretrain_config "$_stage" && [ -n "${ECGPOS_PRETRAIN_SET:-}" ]; then
        ecgpos_log "note: no ecgpos with --check-config runs here (after ECGPOS_SETUP): ECGPOS_PRETRAIN_SET is" \
            "checked when the stage $_stage job starts"
    fi
done
[ "$ECGPOS_DRY_RUN" = 1 ] || command -v sbatch >/dev/null || ecgpos_die "sbatch not found: run this on a Slurm login node"
[ "$ECGPOS_DRY_RUN" = 1 ] || mkdir -p "$ECGPOS_LOG_DIR" "$ECGPOS_WORK"   # sbatch cannot create the log folder

# One chain per work folder at a time: a second one would run a second trainer into the same run folder.
# Every job carries the work folder in its comment; this user's queued or running jobs are looked up by it.
tag="ecgpos:$(cd "$ECGPOS_WORK" 2>/dev/null && pwd -P || echo "$ECGPOS_WORK")"
if [ "$ECGPOS_DRY_RUN" != 1 ]; then
    active=$(squeue -h -u "$(id -un)" -o '%A|%k' | awk -F'|' -v tag="$tag" '$2 == tag { print $1 }' | sort -u) ||
        ecgpos_die "squeue failed: cannot tell whether jobs of an earlier submission are still queued"
    [ -z "$active" ] || ecgpos_die "jobs $(echo "$active" | paste -sd' ') of an earlier submission for" \
        "ECGPOS_WORK=$ECGPOS_WORK are still queued or running: wait for them or scancel them"
fi

# Options every job gets: where to log, where to run, and the site's account / partition / qos if given.
common=(--parsable --kill-on-invalid-dep=yes --chdir="$PWD" --export=ALL --comment="$tag")
[ -n "${ECGPOS_PARTITION:-}" ] && common+=(--partition="$ECGPOS_PARTITION")
[ -n "${ECGPOS_ACCOUNT:-}" ] && common+=(--account="$ECGPOS_ACCOUNT")
[ -n "${ECGPOS_QOS:-}" ] && common+=(--qos="$ECGPOS_QOS")
ecgpos_words ECGPOS_SBATCH_ARGS _sbatch_args
common+=("${_sbatch_args[@]}")
log_single=(--output="$ECGPOS_LOG_DIR/%x-%j.out")
log_array=(--output="$ECGPOS_LOG_DIR/%x-%A_%a.out")
gres() { if [ "$1" -gt 0 ]; then echo "--gres=gpu:$1"; fi; }

# A submission that sbatch refuses (e.g. a gres or time limit the partition does not allow) cancels the jobs
# submitted before it: no half chain is left in the queue.
prev=""
submitted=()
submit() {  # submit STEP SBATCH-ARGS... ; chains on the previous job and prints "STEP JOBID"
    local step=$1 id dep=()
    shift
    [ -n "$prev" ] && dep=(--dependency="afterok:$prev")
    if [ "$ECGPOS_DRY_RUN" = 1 ]; then   # print what would be submitted; fake ids keep the chain readable
        echo "# $(printf '%q ' sbatch "${common[@]}" "${dep[@]}" "$@")"
        id="<$step>"
    elif ! id=$(sbatch "${common[@]}" "${dep[@]}" "$@"); then
        [ "${#submitted[@]}" -eq 0 ] || scancel "${submitted[@]}" || true
        ecgpos_die "sbatch failed for the $step job (its message is above)${submitted[*]:+; cancelled jobs ${submitted[*]}}"
    else
        id=${id%%;*}   # --parsable prints "id;cluster" on multi-cluster sites
        submitted+=("$id")
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
ecgpos_words ECGPOS_PROBE_TASKS _tasks
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
