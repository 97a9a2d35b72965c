# Submitting the chain's jobs, shared by slurm/pipeline.sh (the chain) and slurm/decide.sbatch (the levels and
# the downstream jobs a --depth auto chain submits as it goes). Sourced after slurm/common.sh.
# shellcheck shell=bash
ECGPOS_SLURM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)   # the sbatch scripts beside this file

# Job sizes and the chain's other settings (slurm/env.example); the jobs of a --depth auto chain see the
# values pipeline.sh saw (every job gets its environment, and the same working folder).
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
# --depth auto: the stop rules of `ecgpos carve` and the decide jobs' size (the criterion's forward passes
# over the held-out records run on a GPU when the job has one)
: "${ECGPOS_MAX_LEVELS:=4}"
: "${ECGPOS_STOP_BELOW:=0.05}"
: "${ECGPOS_MIN_DROP:=0.01}"
: "${ECGPOS_VAL_FRACTION:=0.1}"
: "${ECGPOS_DECIDE_CPUS:=4}"
: "${ECGPOS_DECIDE_GPUS:=$ECGPOS_PROBE_GPUS}"
: "${ECGPOS_DECIDE_TIME:=04:00:00}"

wants() { [[ " $ECGPOS_STEPS " == *" $1 "* ]]; }
gres() { if [ "$1" -gt 0 ]; then echo "--gres=gpu:$1"; fi; }

# ecgpos_submit_options: the options every job gets (its log, working folder, the work folder's tag in its
# comment, the site's account / partition / qos) in the arrays common, log_single and log_array. Every job
# carries the work folder in its comment: pipeline.sh finds an earlier chain's jobs still in the queue by it.
ecgpos_submit_options() {
    tag="ecgpos:$(cd "$ECGPOS_WORK" 2>/dev/null && pwd -P || echo "$ECGPOS_WORK")"
    common=(--parsable --kill-on-invalid-dep=yes --chdir="$PWD" --export=ALL --comment="$tag")
    [ -n "${ECGPOS_PARTITION:-}" ] && common+=(--partition="$ECGPOS_PARTITION")
    [ -n "${ECGPOS_ACCOUNT:-}" ] && common+=(--account="$ECGPOS_ACCOUNT")
    [ -n "${ECGPOS_QOS:-}" ] && common+=(--qos="$ECGPOS_QOS")
    local sbatch_args
    ecgpos_words ECGPOS_SBATCH_ARGS sbatch_args
    common+=("${sbatch_args[@]}")
    log_single=(--output="$ECGPOS_LOG_DIR/%x-%j.out")
    log_array=(--output="$ECGPOS_LOG_DIR/%x-%A_%a.out")
    submitted=()
}

# submit STEP "DEPENDENCY IDS" SBATCH-ARGS...: submit one job (afterok on the given ids), print "STEP JOBID"
# and set $id. A submission that sbatch refuses (e.g. a gres or time limit the partition does not allow)
# cancels the jobs submitted before it: no half chain is left in the queue.
# With ECGPOS_SUBMIT_RECORD set (a decide job), each submission is appended to that file as "STEP JOBID" and a
# STEP already there is not submitted again: a requeued decide job submits nothing twice.
submit() {
    local step=$1 deps dep=() recorded=""
    read -r -a deps <<< "$2"
    shift 2
    [ "${#deps[@]}" -gt 0 ] && dep=(--dependency="afterok:$(IFS=:; echo "${deps[*]}")")
    if [ -n "${ECGPOS_SUBMIT_RECORD:-}" ] && [ -f "$ECGPOS_SUBMIT_RECORD" ]; then
        recorded=$(awk -v step="$step" '$1 == step { print $2; exit }' "$ECGPOS_SUBMIT_RECORD")
    fi
    if [ -n "$recorded" ]; then
        id=$recorded
        ecgpos_log "$step: job $id, submitted by an earlier run of this job ($ECGPOS_SUBMIT_RECORD); not again"
    elif [ "$ECGPOS_DRY_RUN" = 1 ]; then   # print what would be submitted; fake ids keep the chain readable
        echo "# $(printf '%q ' sbatch "${common[@]}" "${dep[@]}" "$@")"
        id="<$step>"
    elif ! id=$(sbatch "${common[@]}" "${dep[@]}" "$@"); then
        [ "${#submitted[@]}" -eq 0 ] || scancel "${submitted[@]}" || true
        [ -z "${ECGPOS_SUBMIT_RECORD:-}" ] || rm -f "$ECGPOS_SUBMIT_RECORD"   # those jobs are gone again
        ecgpos_die "sbatch failed for the $step job (its message is above)${submitted[*]:+; cancelled jobs ${submitted[*]}}"
    else
        id=${id%%;*}   # --parsable prints "id;cluster" on multi-cluster sites
        submitted+=("$id")
        [ -z "${ECGPOS_SUBMIT_RECORD:-}" ] || echo "$step $id" >> "$ECGPOS_SUBMIT_RECORD"
    fi
    echo "$step $id"
}

# ecgpos_submit_level LEVEL "DEPENDENCY IDS": the pretraining job of level LEVEL (slurm/pretrain.sbatch).
ecgpos_submit_level() {
    # shellcheck disable=SC2046  # gres() prints nothing or one word
    submit "level$1" "$2" --job-name="ecgpos-level$1" "${log_single[@]}" \
        --nodes="$ECGPOS_NODES" --ntasks-per-node=1 --cpus-per-task="$ECGPOS_PRETRAIN_CPUS" \
        --time="$ECGPOS_PRETRAIN_TIME" --signal="B:USR1@$ECGPOS_SIGNAL_SECONDS" --requeue \
        $(gres "$ECGPOS_GPUS_PER_NODE") "$ECGPOS_SLURM_DIR/pretrain.sbatch" "$1"
}

# ecgpos_submit_decide LEVEL "DEPENDENCY IDS": the decide job after level LEVEL (slurm/decide.sbatch).
ecgpos_submit_decide() {
    # shellcheck disable=SC2046
    submit "decide$1" "$2" --job-name="ecgpos-decide$1" "${log_single[@]}" --cpus-per-task="$ECGPOS_DECIDE_CPUS" \
        --time="$ECGPOS_DECIDE_TIME" --requeue $(gres "$ECGPOS_DECIDE_GPUS") "$ECGPOS_SLURM_DIR/decide.sbatch" "$1"
}

# ecgpos_downstream_encoders LEVEL...: the encoders to probe (array encoders) with, in made_by, the level among
# LEVEL... (the levels this submission trains) whose run each one is, or "-". Any other encoder must exist.
# Refused with one line: an encoder that does not exist, two encoders whose probes share a folder.
ecgpos_downstream_encoders() {
    local e by level names=" summary " name var=ECGPOS_PROBE_ENCODERS   # the summary is beside the encoders
    encoders=() made_by=()
    ecgpos_probe_encoders encoders
    [ -z "${ECGPOS_PROBE_ENCODER:-}" ] || var=ECGPOS_PROBE_ENCODER
    for e in "${encoders[@]}"; do
        by=-
        for level in "$@"; do
            [ "$(realpath -m -- "$e")" != "$(realpath -m -- "$ECGPOS_RUNS/level$level")" ] || by=$level
        done
        made_by+=("$by")
        if wants probe && [[ $e != random:* ]] && [ "$by" = - ]; then
            [ -d "$e" ] || ecgpos_die "$var: $e is not a folder (an encoder to probe; add the level that makes it" \
                "to ECGPOS_STEPS)"
        fi
        if [ -z "${ECGPOS_PROBE_ENCODER:-}" ]; then   # each encoder's probes go to $ECGPOS_PROBES/<name>/
            name=$(ecgpos_probe_name "$e")
            [[ $names != *" $name "* ]] || ecgpos_die "ECGPOS_PROBE_ENCODERS: $e would write its probes into" \
                "$ECGPOS_PROBES/$name, which another encoder or the summary uses (folder names must differ)"
            names+="$name "
        fi
    done
}

# ecgpos_submit_downstream: the steps after pretraining that ECGPOS_STEPS asks for: one probe array per encoder
# (after the job in level_job of the level that makes it, when submitted here, else after the jobs in after),
# the merge, the fine-tuning and the export (of the top level, $ECGPOS_RUNS/level<ECGPOS_DEPTH-1>).
ecgpos_submit_downstream() {
    local i waits step arg tasks probe_jobs=()
    ecgpos_words ECGPOS_PROBE_TASKS tasks
    if wants probe; then
        for i in "${!encoders[@]}"; do
            waits="${after[*]}" step=probe arg=()
            [ "${made_by[$i]}" = - ] || [ "${level_job[${made_by[$i]}]:--}" = - ] || waits=${level_job[${made_by[$i]}]}
            if [ -z "${ECGPOS_PROBE_ENCODER:-}" ]; then   # the step and job name: one word of the folder name
                step=$(ecgpos_probe_name "${encoders[$i]}") arg=("${encoders[$i]}")
                step="probe-${step//[^A-Za-z0-9._-]/_}"
            fi
            # shellcheck disable=SC2046
            submit "$step" "$waits" --job-name="ecgpos-$step" "${log_array[@]}" --array="0-$(( ${#tasks[@]} - 1 ))" \
                --cpus-per-task="$ECGPOS_PROBE_CPUS" --time="$ECGPOS_PROBE_TIME" $(gres "$ECGPOS_PROBE_GPUS") \
                "$ECGPOS_SLURM_DIR/probe.sbatch" "${arg[@]}"
            probe_jobs+=("$id")
        done
        after=("${probe_jobs[@]}")
    fi
    if wants merge; then
        submit merge "${after[*]}" --job-name=ecgpos-probe-merge "${log_single[@]}" --cpus-per-task=1 \
            --time=01:00:00 "$ECGPOS_SLURM_DIR/probe.sbatch" merge
        after=("$id")
    fi
    if wants finetune; then   # not a default step: add it to ECGPOS_STEPS (slurm/finetune.sbatch's settings)
        # shellcheck disable=SC2046
        submit finetune "${after[*]}" --job-name=ecgpos-finetune "${log_array[@]}" \
            --array="0-$(( ${#tasks[@]} - 1 ))" --nodes="$ECGPOS_NODES" $(gres "$ECGPOS_GPUS_PER_NODE") \
            "$ECGPOS_SLURM_DIR/finetune.sbatch"
    fi
    if wants export; then
        submit export "${after[*]}" --job-name=ecgpos-export "${log_single[@]}" --cpus-per-task=1 --time=01:00:00 \
            "$ECGPOS_SLURM_DIR/export.sbatch"
    fi
}
