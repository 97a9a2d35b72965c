#!/usr/bin/env bash
# Submit the whole chain with --dependency=afterok and print one "STEP JOBID" line per job:
#
#   preprocess-<corpus> (array) -> check-<corpus>  (one pair per corpus of ECGPOS_CORPORA) -> level0 -> level1
#   [-> level2 ... with --depth N] -> probe-<encoder> (array over probe tasks; one per encoder of
#   ECGPOS_PROBE_ENCODERS, each after the level that makes its encoder) -> merge (each level vs level 0) -> export
# With the one-corpus ECGPOS_SRC and the one-encoder ECGPOS_PROBE_ENCODER the steps are plain "preprocess",
# "check" and "probe".
#
# Usage:  ECGPOS_CORPORA=... ECGPOS_DATA_ROOT=... slurm/pipeline.sh [--depth N|auto]   (or: set -a; . my.env; ...)
# --depth N (or ECGPOS_DEPTH=N; default 2, the paper's two levels) trains levels 0..N-1: level<l> on the run of
# level<l-1>, every latent level with ECGPOS_LATENT_CONFIG; the export is the top level's run.
# --depth auto (ECGPOS_DEPTH=auto) submits level0 and a decide job after it (slurm/decide.sbatch): each decide job
# measures the carving criterion (`ecgpos carve --decide`), records it in $ECGPOS_RUNS/carve.md, and submits
# either the next level and its decide job or, once a stop rule holds (ECGPOS_MAX_LEVELS, ECGPOS_STOP_BELOW,
# ECGPOS_MIN_DROP), the probe / merge / finetune / export steps the chain of that depth has.
# Every setting is an environment variable with a default; see slurm/env.example. ECGPOS_STEPS picks a
# contiguous part of the chain (e.g. "level1 probe merge export" when the shards and level 0 exist).
# Settings are checked before anything is submitted (one line naming the variable, exit 2); a submission
# that sbatch refuses cancels the jobs submitted before it. A failed job cancels everything that depends on
# it (--kill-on-invalid-dep=yes).
# ECGPOS_DRY_RUN=1 prints the sbatch command lines (prefixed with "#") instead of submitting.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
while [ "$#" -gt 0 ]; do
    case "$1" in
        --depth) [ "$#" -ge 2 ] || { echo "pipeline.sh: --depth needs a value (N or auto)" >&2; exit 2; }
                 ECGPOS_DEPTH=$2; shift 2 ;;
        --depth=*) ECGPOS_DEPTH=${1#--depth=}; shift ;;
        -h|--help) sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "pipeline.sh: unknown argument '$1' (settings are environment variables; see slurm/env.example)" >&2
           exit 2 ;;
    esac
done
# shellcheck source=slurm/common.sh
. "$HERE/common.sh"
# shellcheck source=slurm/submit.sh
. "$HERE/submit.sh"
unset ECGPOS_SUBMIT_RECORD   # a decide job's record of its own submissions (slurm/decide.sbatch)

# The depth: a fixed number of levels, or "auto": level 0 here, the decide jobs submit the levels above it.
[[ ${ECGPOS_DEPTH:-2} =~ ^[1-9][0-9]*$ ]] || [ "${ECGPOS_DEPTH:-}" = auto ] ||
    ecgpos_die "ECGPOS_DEPTH (--depth): expected a number of levels >= 1 or auto, got '${ECGPOS_DEPTH:-}'"
AUTO=0
if [ "$ECGPOS_DEPTH" = auto ]; then
    AUTO=1
    # the stop rules, checked as `ecgpos carve` checks them
    ecgpos_require_int ECGPOS_MAX_LEVELS 1
    ecgpos_require_number ECGPOS_STOP_BELOW "x >= 0 && x <= 1" "a fraction in [0, 1]"
    ecgpos_require_number ECGPOS_MIN_DROP "1" "a number (the least fall of the criterion from one level to the next)"
    ecgpos_require_number ECGPOS_VAL_FRACTION "x > 0 && x < 1" "a fraction in (0, 1)"
    [ -z "${ECGPOS_LEVEL0_RUN:-}" ] || ecgpos_die "ECGPOS_LEVEL0_RUN: --depth auto carves from its own level 0" \
        "($ECGPOS_RUNS/level0); unset it or give --depth N"
fi
LEVELS=()   # the level numbers this submission trains: 0..DEPTH-1 (auto: 0; the decide jobs add the rest)
for (( _l = 0; _l < ${ECGPOS_DEPTH/auto/1}; _l++ )); do LEVELS+=("$_l"); done
LEVEL_STEPS=$(printf 'level%s ' "${LEVELS[@]}")
: "${ECGPOS_STEPS:=preprocess check ${LEVEL_STEPS}probe merge export}"
ECGPOS_STEPS=${ECGPOS_STEPS//stage/level}   # a step named stage<l> is the step level<l>
# Every job's shell sees them; a decide job submits the rest of the chain with the same ones.
export ECGPOS_PROBE_TASKS ECGPOS_SHARDS ECGPOS_RUNS ECGPOS_PROBES ECGPOS_EXPORT HDF5_USE_FILE_LOCKING ECGPOS_STEPS

# --- settings are checked here, before anything is submitted: one line naming the variable, exit 2 ---------
STEPS="preprocess check ${LEVEL_STEPS}probe merge finetune export"
TOP=$(( ${#LEVELS[@]} - 1 ))
read -r -a _steps <<< "$ECGPOS_STEPS"
[ "${#_steps[@]}" -gt 0 ] || ecgpos_die "ECGPOS_STEPS is empty (steps: $STEPS)"
for _s in "${_steps[@]}"; do
    [[ " $STEPS " == *" $_s "* ]] || ecgpos_die "ECGPOS_STEPS: unknown step '$_s' (steps: $STEPS)"
done
if [ "$AUTO" = 1 ]; then   # the decide jobs measure every level from 0 up, so the chain starts at level0
    wants level0 || ecgpos_die "ECGPOS_STEPS: --depth auto carves from level0 (a finished level0 job only checks" \
        "its run); add level0 or give --depth N"
    # every level learns on the same held-out records, on which the decide jobs measure the criterion
    ECGPOS_PRETRAIN_SET="train.val_fraction=$ECGPOS_VAL_FRACTION ${ECGPOS_PRETRAIN_SET:-}"
    export ECGPOS_PRETRAIN_SET ECGPOS_MAX_LEVELS ECGPOS_STOP_BELOW ECGPOS_MIN_DROP ECGPOS_VAL_FRACTION
fi
wants_a_level() { local l; for l in "${LEVELS[@]}"; do wants "level$l" && return 0; done; return 1; }
for _v in ECGPOS_NODES:1 ECGPOS_PREPROCESS_PARTS:1 ECGPOS_PREPROCESS_CPUS:1 ECGPOS_PRETRAIN_CPUS:1 \
          ECGPOS_SIGNAL_SECONDS:1 ECGPOS_PROBE_CPUS:1 ECGPOS_PROBE_GPUS:0; do
    ecgpos_require_int "${_v%:*}" "${_v#*:}"
done
[ -z "${ECGPOS_MAX_REQUEUES:-}" ] || ecgpos_require_int ECGPOS_MAX_REQUEUES 0
[ "$AUTO" = 0 ] || { ecgpos_require_int ECGPOS_DECIDE_CPUS 1; ecgpos_require_int ECGPOS_DECIDE_GPUS 0; }
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
if wants level0; then ecgpos_require_config ECGPOS_LEVEL0_CONFIG; fi
if [ "$AUTO" = 1 ] && [ "$ECGPOS_MAX_LEVELS" -gt 1 ]; then ecgpos_require_config ECGPOS_LATENT_CONFIG; fi
for _l in "${LEVELS[@]:1}"; do
    wants "level$_l" || continue
    ecgpos_require_config ECGPOS_LATENT_CONFIG
    if ! wants "level$(( _l - 1 ))"; then   # the frozen levels below must exist already
        if [ "$_l" = 1 ]; then
            ECGPOS_LEVEL0_RUN=${ECGPOS_LEVEL0_RUN:-$ECGPOS_RUNS/level0}
            ecgpos_require_dir ECGPOS_LEVEL0_RUN "level 1's level-0 run or export; add level0 to ECGPOS_STEPS"
        else
            [ -d "$(ecgpos_level_base "$_l")" ] || ecgpos_die "$(ecgpos_level_base "$_l") is not a folder (the run" \
                "level $_l trains on; add level$(( _l - 1 )) to ECGPOS_STEPS)"
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
# trains waits for that level only (the level-0 probes run while level 1 trains); any other encoder must exist.
# --depth auto: the decide job that stops submits the probes of the levels then trained.
encoders=() made_by=()
if [ "$AUTO" = 1 ] && { wants probe || wants merge; }; then   # the encoders of the deepest chain it may carve
    _trained=()
    for (( _l = 0; _l < ECGPOS_MAX_LEVELS; _l++ )); do _trained+=("$_l"); done
    ECGPOS_DEPTH=$ECGPOS_MAX_LEVELS ecgpos_downstream_encoders "${_trained[@]}"
elif wants probe || wants merge; then
    _trained=()
    for _l in "${LEVELS[@]}"; do if wants "level$_l"; then _trained+=("$_l"); fi; done
    ecgpos_downstream_encoders "${_trained[@]}"
fi
if wants merge && [ -n "${ECGPOS_PROBE_REFERENCE:-}" ] && [ "$ECGPOS_PROBE_REFERENCE" != paper ] &&
    [ ! -f "$ECGPOS_PROBE_REFERENCE" ]; then
    ecgpos_die "ECGPOS_PROBE_REFERENCE=$ECGPOS_PROBE_REFERENCE is neither paper nor a file (empty: no published rows)"
fi
if [ "$AUTO" = 0 ] && wants export && ! wants "level$TOP"; then
    ECGPOS_EXPORT_RUN=${ECGPOS_EXPORT_RUN:-$ECGPOS_RUNS/level$TOP}
    ecgpos_require_dir ECGPOS_EXPORT_RUN "the run to export; add level$TOP to ECGPOS_STEPS"
fi
# Last, as it imports ecgpos: each level's config with the overrides, resolved as its job will resolve it.
_check=("${LEVELS[@]}")
[ "$AUTO" = 0 ] || [ "$ECGPOS_MAX_LEVELS" -eq 1 ] || _check+=(1)   # level 1's config serves every level above
for _lvl in "${_check[@]}"; do
    if { wants "level$_lvl" || [ "$AUTO" = 1 ]; } && ! ecgpos_check_pretrain_config "$_lvl" &&
        [ -n "${ECGPOS_PRETRAIN_SET:-}" ]; then
        ecgpos_log "note: no ecgpos with --check-config runs here (after ECGPOS_SETUP): ECGPOS_PRETRAIN_SET is" \
            "checked when the level $_lvl job starts"
    fi
done
[ "$ECGPOS_DRY_RUN" = 1 ] || command -v sbatch >/dev/null || ecgpos_die "sbatch not found: run this on a Slurm login node"
[ "$ECGPOS_DRY_RUN" = 1 ] || mkdir -p "$ECGPOS_LOG_DIR" "$ECGPOS_WORK"   # sbatch cannot create the log folder

# One chain per work folder at a time: a second one would run a second trainer into the same run folder.
# Every job carries the work folder in its comment; this user's queued or running jobs are looked up by it.
ecgpos_submit_options
if [ "$ECGPOS_DRY_RUN" != 1 ]; then
    active=$(squeue -h -u "$(id -un)" -o '%A|%k' | awk -F'|' -v tag="$tag" '$2 == tag { print $1 }' | sort -u) ||
        ecgpos_die "squeue failed: cannot tell whether jobs of an earlier submission are still queued"
    [ -z "$active" ] || ecgpos_die "jobs $(echo "$active" | paste -sd' ') of an earlier submission for" \
        "ECGPOS_WORK=$ECGPOS_WORK are still queued or running: wait for them or scancel them"
fi

after=()   # the jobs of the latest step(s): the next step waits for all of them
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
level_job=()   # the job of each level submitted here ("-": none)
for level in "${LEVELS[@]}"; do
    level_job[$level]=-
    if wants "level$level"; then
        ecgpos_submit_level "$level" "${after[*]}"
        level_job[$level]=$id after=("$id")
    fi
done
if [ "$AUTO" = 1 ]; then   # the decide job after level 0 submits the rest
    ecgpos_submit_decide 0 "$id"
else
    ecgpos_submit_downstream
fi
