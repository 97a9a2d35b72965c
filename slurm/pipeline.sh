#!/usr/bin/env bash
# Submit the whole chain with --dependency=afterok and print one "STEP JOBID" line per job:
#
#   preprocess-<corpus> (array) -> check-<corpus>  (one pair per corpus of ECGPOS_CORPORA) -> stage0 -> stage1
#   [-> stage2 ... with --depth N] -> probe-<encoder> (array over probe tasks; one per encoder of
#   ECGPOS_PROBE_ENCODERS, each after the stage that makes its encoder) -> merge (each level vs Stage 0) -> export
# With the one-corpus ECGPOS_SRC and the one-encoder ECGPOS_PROBE_ENCODER the steps are plain "preprocess",
# "check" and "probe".
#
# Usage:  ECGPOS_CORPORA=... ECGPOS_DATA_ROOT=... slurm/pipeline.sh [--depth N]   (or: set -a; . my.env; ...)
# --depth N (or ECGPOS_DEPTH=N; default 2, the paper's two stages) trains levels 0..N-1: stage<l> on the run of
# stage<l-1>, every latent level with ECGPOS_STAGE1_CONFIG; the export is the top level's run.
# Every setting is an environment variable with a default; see slurm/env.example. ECGPOS_STEPS picks a
# contiguous part of the chain (e.g. "stage1 probe merge export" when the shards and Stage 0 exist).
# Settings are checked before anything is submitted (one line naming the variable, exit 2); a submission
# that sbatch refuses cancels the jobs submitted before it. A failed job cancels everything that depends on
# it (--kill-on-invalid-dep=yes).
# ECGPOS_DRY_RUN=1 prints the sbatch command lines (prefixed with "#") instead of submitting.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
while [ "$#" -gt 0 ]; do
    case "$1" in
        --depth) [ "$#" -ge 2 ] || { echo "pipeline.sh: --depth needs a value (N)" >&2; exit 2; }
                 ECGPOS_DEPTH=$2; shift 2 ;;
        --depth=*) ECGPOS_DEPTH=${1#--depth=}; shift ;;
        *) echo "pipeline.sh: unknown argument '$1' (settings are environment variables; see slurm/env.example)" >&2
           exit 2 ;;
    esac
done
# shellcheck source=slurm/common.sh
. "$HERE/common.sh"

# The depth: a fixed number of levels. A depth the chain decides as it goes ("auto") is submitted by
# ecgpos_submit_auto_depth when slurm/common.sh defines it; the levels loop below is the fixed case.
[[ ${ECGPOS_DEPTH:-2} =~ ^[1-9][0-9]*$ ]] || [ "${ECGPOS_DEPTH:-}" = auto ] ||
    ecgpos_die "ECGPOS_DEPTH (--depth): expected a number of levels >= 1, got '${ECGPOS_DEPTH:-}'"
if [ "$ECGPOS_DEPTH" = auto ] && ! declare -F ecgpos_submit_auto_depth >/dev/null; then
    ecgpos_die "--depth auto: this version submits a fixed depth only; give --depth N"
fi
LEVELS=()   # the level numbers 0..DEPTH-1 (auto: the chain's first two; the decide jobs add the rest)
for (( _l = 0; _l < ${ECGPOS_DEPTH/auto/2}; _l++ )); do LEVELS+=("$_l"); done
STAGE_STEPS=$(printf 'stage%s ' "${LEVELS[@]}")
: "${ECGPOS_STEPS:=preprocess check ${STAGE_STEPS}probe merge export}"
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
STEPS="preprocess check ${STAGE_STEPS}probe merge finetune export"
TOP=$(( ${#LEVELS[@]} - 1 ))
read -r -a _steps <<< "$ECGPOS_STEPS"
[ "${#_steps[@]}" -gt 0 ] || ecgpos_die "ECGPOS_STEPS is empty (steps: $STEPS)"
for _s in "${_steps[@]}"; do
    [[ " $STEPS " == *" $_s "* ]] || ecgpos_die "ECGPOS_STEPS: unknown step '$_s' (steps: $STEPS)"
done
wants() { [[ " $ECGPOS_STEPS " == *" $1 "* ]]; }
wants_a_level() { local l; for l in "${LEVELS[@]}"; do wants "stage$l" && return 0; done; return 1; }
for _v in ECGPOS_NODES:1 ECGPOS_PREPROCESS_PARTS:1 ECGPOS_PREPROCESS_CPUS:1 ECGPOS_PRETRAIN_CPUS:1 \
          ECGPOS_SIGNAL_SECONDS:1 ECGPOS_PROBE_CPUS:1 ECGPOS_PROBE_GPUS:0; do
    ecgpos_require_int "${_v%:*}" "${_v#*:}"
done
[ -z "${ECGPOS_MAX_REQUEUES:-}" ] || ecgpos_require_int ECGPOS_MAX_REQUEUES 0
# the lists the jobs split (an unclosed quote would fail each job in turn, hours later in the queue)
for _v in ECGPOS_SBATCH_ARGS ECGPOS_PRETRAIN_SET ECGPOS_PROBE_TASKS ECGPOS_PREPROCESS_ARGS ECGPOS_PROBE_ARGS \
          ECGPOS_EXPORT_ARGS ECGPOS_CORPORA ECGPOS_PROBE_ENCODERS; do
    ecgpos_words "$_v" _words
done
ecgpos_require_setup
datasets=() sources=() shard_dirs=()
ecgpos_corpora datasets sources shard_dirs
if wants preprocess; then
    if [ -z "${ECGPOS_CORPORA:-}" ]; then
        [ -n "${ECGPOS_SRC:-}" ] || ecgpos_die "set ECGPOS_CORPORA (the corpora to pretrain on, as dataset=path) or" \
            "ECGPOS_SRC (one corpus)"
        ecgpos_require_dir ECGPOS_SRC "raw pretraining corpus"
    fi
    for _i in "${!datasets[@]}"; do
        [ -d "${sources[$_i]}" ] ||
            ecgpos_die "ECGPOS_CORPORA: ${sources[$_i]} is not a folder (the raw ${datasets[$_i]} corpus)"
    done
fi
if wants_a_level && ! wants preprocess; then
    for _d in "${shard_dirs[@]}"; do
        [ -f "$_d/index.csv" ] ||
            ecgpos_die "ECGPOS_SHARDS: $_d has no index.csv: add preprocess to ECGPOS_STEPS or set ECGPOS_SHARDS"
    done
fi
if wants stage0; then ecgpos_require_config ECGPOS_STAGE0_CONFIG; fi
for _l in "${LEVELS[@]:1}"; do
    wants "stage$_l" || continue
    ecgpos_require_config ECGPOS_STAGE1_CONFIG
    if ! wants "stage$(( _l - 1 ))"; then   # the frozen levels below must exist already
        if [ "$_l" = 1 ]; then
            ECGPOS_STAGE0_RUN=${ECGPOS_STAGE0_RUN:-$ECGPOS_RUNS/stage0}
            ecgpos_require_dir ECGPOS_STAGE0_RUN "Stage 1's Stage-0 run or export; add stage0 to ECGPOS_STEPS"
        else
            [ -d "$(ecgpos_level_base "$_l")" ] || ecgpos_die "$(ecgpos_level_base "$_l") is not a folder (the run" \
                "level $_l trains on; add stage$(( _l - 1 )) to ECGPOS_STEPS)"
        fi
    fi
done
if wants probe; then
    ecgpos_require_dir ECGPOS_DATA_ROOT "the folder holding ptbxl/ and cpsc2018/"
    ECGPOS_SPLITS=${ECGPOS_SPLITS:-$ECGPOS_DATA_ROOT/merl_splits}
    ecgpos_require_dir ECGPOS_SPLITS "MERL's split folders"
    ecgpos_require_probe_tasks
fi
# The encoders to probe, with the level whose run each one is, or "-": a probe of a run this chain
# trains waits for that stage only (the Stage-0 probes run while Stage 1 trains); any other encoder must exist.
encoders=() made_by=()
wants probe || wants merge && ecgpos_probe_encoders encoders
_encoder_var=ECGPOS_PROBE_ENCODERS
[ -z "${ECGPOS_PROBE_ENCODER:-}" ] || _encoder_var=ECGPOS_PROBE_ENCODER
_names=" summary "   # the merged summary's folder is beside the encoders' folders
for _e in "${encoders[@]}"; do
    _by=-
    for _stage in "${LEVELS[@]}"; do
        [ "$(realpath -m -- "$_e")" != "$(realpath -m -- "$ECGPOS_RUNS/stage$_stage")" ] || _by=$_stage
    done
    made_by+=("$_by")
    if wants probe && [[ $_e != random:* ]] && { [ "$_by" = - ] || ! wants "stage$_by"; }; then
        [ -d "$_e" ] || ecgpos_die "$_encoder_var: $_e is not a folder (an encoder to probe; add the stage that" \
            "makes it to ECGPOS_STEPS)"
    fi
    if [ -z "${ECGPOS_PROBE_ENCODER:-}" ]; then   # each encoder's probes go to $ECGPOS_PROBES/<name>/
        _name=$(ecgpos_probe_name "$_e")
        [[ $_names != *" $_name "* ]] || ecgpos_die "ECGPOS_PROBE_ENCODERS: $_e would write its probes into" \
            "$ECGPOS_PROBES/$_name, which another encoder or the summary uses (folder names must differ)"
        _names+="$_name "
    fi
done
if wants merge && [ -n "${ECGPOS_PROBE_REFERENCE:-}" ] && [ "$ECGPOS_PROBE_REFERENCE" != paper ] &&
    [ ! -f "$ECGPOS_PROBE_REFERENCE" ]; then
    ecgpos_die "ECGPOS_PROBE_REFERENCE=$ECGPOS_PROBE_REFERENCE is neither paper nor a file (empty: no published rows)"
fi
if wants export && ! wants "stage$TOP"; then
    ECGPOS_EXPORT_RUN=${ECGPOS_EXPORT_RUN:-$ECGPOS_RUNS/stage$TOP}
    ecgpos_require_dir ECGPOS_EXPORT_RUN "the run to export; add stage$TOP to ECGPOS_STEPS"
fi
# Last, as it imports ecgpos: each level's config with the overrides, resolved as its job will resolve it.
for _stage in "${LEVELS[@]}"; do
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
submitted=()
after=()   # the jobs of the latest step(s): the next step waits for all of them
submit() {  # submit STEP "DEPENDENCY IDS" SBATCH-ARGS... ; prints "STEP JOBID" and sets $id
    local step=$1 deps dep=()
    read -r -a deps <<< "$2"
    shift 2
    [ "${#deps[@]}" -gt 0 ] && dep=(--dependency="afterok:$(IFS=:; echo "${deps[*]}")")
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
}

# one preprocess array and one check per corpus; the corpora are preprocessed side by side
corpus_jobs=()
for _i in "${!datasets[@]}"; do
    # the one-corpus form keeps its step names and its preprocess.sbatch command line
    suffix="-${datasets[$_i]}" arg=("${datasets[$_i]}")
    [ -n "${ECGPOS_CORPORA:-}" ] || suffix="" arg=()
    last="${after[*]}"
    if wants preprocess; then
        submit "preprocess$suffix" "$last" --job-name="ecgpos-preprocess$suffix" "${log_array[@]}" \
            --array="0-$(( ECGPOS_PREPROCESS_PARTS - 1 ))" --cpus-per-task="$ECGPOS_PREPROCESS_CPUS" \
            --time="$ECGPOS_PREPROCESS_TIME" "$HERE/preprocess.sbatch" "${arg[@]}"
        last=$id
    fi
    if wants check; then
        submit "check$suffix" "$last" --job-name="ecgpos-preprocess-check$suffix" "${log_single[@]}" \
            --cpus-per-task=1 --time=01:00:00 "$HERE/preprocess.sbatch" check "${arg[@]}"
        last=$id
    fi
    [ "$last" = "${after[*]}" ] || corpus_jobs+=("$last")
done
[ "${#corpus_jobs[@]}" -eq 0 ] || after=("${corpus_jobs[@]}")
stage_job=()   # the job of each level submitted here ("-": none)
for stage in "${LEVELS[@]}"; do
    stage_job[$stage]=-
    if wants "stage$stage"; then
        # shellcheck disable=SC2046  # gres() prints nothing or one word
        submit "stage$stage" "${after[*]}" --job-name="ecgpos-stage$stage" "${log_single[@]}" \
            --nodes="$ECGPOS_NODES" --ntasks-per-node=1 --cpus-per-task="$ECGPOS_PRETRAIN_CPUS" \
            --time="$ECGPOS_PRETRAIN_TIME" --signal="B:USR1@$ECGPOS_SIGNAL_SECONDS" --requeue \
            $(gres "$ECGPOS_GPUS_PER_NODE") "$HERE/pretrain.sbatch" "$stage"
        stage_job[$stage]=$id after=("$id")
    fi
done
_tasks=()
ecgpos_words ECGPOS_PROBE_TASKS _tasks
if wants probe; then
    probe_jobs=()
    for _i in "${!encoders[@]}"; do
        # one array per encoder, after the stage that makes it (when submitted here), else after the latest step
        waits="${after[*]}" step=probe arg=()
        [ "${made_by[$_i]}" = - ] || [ "${stage_job[${made_by[$_i]}]}" = - ] || waits=${stage_job[${made_by[$_i]}]}
        if [ -z "${ECGPOS_PROBE_ENCODER:-}" ]; then   # the step and job name: one word of the folder name
            step=$(ecgpos_probe_name "${encoders[$_i]}") arg=("${encoders[$_i]}")
            step="probe-${step//[^A-Za-z0-9._-]/_}"
        fi
        # shellcheck disable=SC2046
        submit "$step" "$waits" --job-name="ecgpos-$step" "${log_array[@]}" --array="0-$(( ${#_tasks[@]} - 1 ))" \
            --cpus-per-task="$ECGPOS_PROBE_CPUS" --time="$ECGPOS_PROBE_TIME" $(gres "$ECGPOS_PROBE_GPUS") \
            "$HERE/probe.sbatch" "${arg[@]}"
        probe_jobs+=("$id")
    done
    after=("${probe_jobs[@]}")
fi
if wants merge; then
    submit merge "${after[*]}" --job-name=ecgpos-probe-merge "${log_single[@]}" --cpus-per-task=1 --time=01:00:00 \
        "$HERE/probe.sbatch" merge
    after=("$id")
fi
if wants finetune; then   # not a default step: add it to ECGPOS_STEPS (slurm/finetune.sbatch's settings)
    # shellcheck disable=SC2046
    submit finetune "${after[*]}" --job-name=ecgpos-finetune "${log_array[@]}" --array="0-$(( ${#_tasks[@]} - 1 ))" \
        --nodes="$ECGPOS_NODES" $(gres "$ECGPOS_GPUS_PER_NODE") "$HERE/finetune.sbatch"
fi
if wants export; then
    submit export "${after[*]}" --job-name=ecgpos-export "${log_single[@]}" --cpus-per-task=1 --time=01:00:00 \
        "$HERE/export.sbatch"
fi
