# Shared by the slurm/*.sbatch scripts (sourced, not run). Defaults for every ECGPOS_* variable are here and
# in slurm/env.example; nothing cluster-specific (paths, accounts, partitions) is hard-coded.
# shellcheck shell=bash

# Repository root: where this file lives (dry runs, `bash slurm/NAME.sbatch`), else what pipeline.sh exported.
: "${ECGPOS_REPO:=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${ECGPOS_WORK:=$PWD/ecgpos-work}"          # outputs: shards/, runs/, probes/, export/
: "${ECGPOS_SHARDS:=$ECGPOS_WORK/shards}"
: "${ECGPOS_RUNS:=$ECGPOS_WORK/runs}"
: "${ECGPOS_PROBES:=$ECGPOS_WORK/probes}"
: "${ECGPOS_EXPORT:=$ECGPOS_WORK/export}"
# ECGPOS_STAGE0_CONFIG, ECGPOS_STAGE1_CONFIG and ECGPOS_STAGE0_RUN are read as the three settings below them
: "${ECGPOS_LEVEL0_CONFIG:=${ECGPOS_STAGE0_CONFIG:-$ECGPOS_REPO/configs/level0.yaml}}"
: "${ECGPOS_LATENT_CONFIG:=${ECGPOS_STAGE1_CONFIG:-$ECGPOS_REPO/configs/level1.yaml}}"   # every level >= 1
: "${ECGPOS_LEVEL0_RUN:=${ECGPOS_STAGE0_RUN:-}}"   # level 1's base when set (default: $ECGPOS_RUNS/level0)
: "${ECGPOS_DEPTH:=2}"                          # levels the chain trains: level0 .. level<DEPTH-1>
: "${ECGPOS_GPUS_PER_NODE:=1}"                  # 0 = CPU only (no --gres, accelerate --cpu)
: "${ECGPOS_DRY_RUN:=0}"                        # 1 = print the commands instead of running them
export ECGPOS_REPO ECGPOS_WORK ECGPOS_DEPTH

# ecgpos_level_config LEVEL: the run config of a level: ECGPOS_LEVEL0_CONFIG at 0, ECGPOS_LATENT_CONFIG above.
ecgpos_level_config() { if [ "$1" -eq 0 ]; then echo "$ECGPOS_LEVEL0_CONFIG"; else echo "$ECGPOS_LATENT_CONFIG"; fi; }
# ecgpos_level_base LEVEL (>= 1): the frozen levels below it: the run of level LEVEL-1 (ECGPOS_LEVEL0_RUN, when
# set, for level 1).
ecgpos_level_base() {
    if [ "$1" -eq 1 ]; then echo "${ECGPOS_LEVEL0_RUN:-$ECGPOS_RUNS/level0}"; else echo "$ECGPOS_RUNS/level$(( $1 - 1 ))"; fi
}

# Compiled kernels (train.compile) are kept in the work folder, where every job of the chain finds them:
# Inductor's default, /tmp, is node-local (often per job), and a cold compile of a paper config takes
# minutes, paid again by each requeued or resumed run and by level 1 otherwise.
: "${TORCHINDUCTOR_CACHE_DIR:=$ECGPOS_WORK/compile-cache}"
export TORCHINDUCTOR_CACHE_DIR

# HDF5 file locks fail or hang on NFS/Lustre/GPFS; shards are written once and then only read.
export HDF5_USE_FILE_LOCKING=FALSE
export PYTHONUNBUFFERED=1

ecgpos_log() { echo "[$(date -u +%FT%TZ) ${SLURM_JOB_ID:-nojob}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}] $*" >&2; }
ecgpos_die() { ecgpos_log "error: $*"; exit 2; }

# Checks of settings, each failing with one line that names the variable (exit 2).
# ecgpos_require_int NAME MIN: $NAME is a whole number >= MIN; it is rewritten without leading zeros, which
# bash arithmetic would read as octal ("08" fails there, "010" is 8).
ecgpos_require_int() {
    local name=$1 min=$2 value=${!1:-}
    if ! [[ $value =~ ^[0-9]+$ ]] || (( 10#$value < min )); then
        ecgpos_die "$name must be a whole number >= $min, got '$value'"
    fi
    printf -v "$name" '%d' "$(( 10#$value ))"
}
# ecgpos_require_number NAME CONDITION WHAT: $NAME is a decimal number x for which the awk CONDITION holds
# ("x >= 0 && x <= 1"); WHAT says what it must be.
ecgpos_require_number() {
    local name=$1 value=${!1:-}
    if ! [[ $value =~ ^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
        ! awk -v x="$value" "BEGIN { x += 0; exit !($2) }"; then
        ecgpos_die "$name must be $3, got '$value'"
    fi
}
# ecgpos_require_dir NAME WHAT: $NAME is set and an existing folder.
ecgpos_require_dir() {
    local name=$1 what=$2 value=${!1:-}
    [ -n "$value" ] || ecgpos_die "set $name ($what)"
    [ -d "$value" ] || ecgpos_die "$name=$value is not a folder ($what)"
}
# ecgpos_require_config NAME: $NAME is a YAML file or a shipped config name (level0, tiny/level1, level0.yaml).
ecgpos_require_config() {
    local name=$1 value=${!1:-}
    [ -n "$value" ] || ecgpos_die "set $name (a config file or a shipped config name)"
    [ -f "$value" ] && return
    [[ $value != /* ]] && [ -f "$ECGPOS_REPO/configs/${value%.yaml}.yaml" ] && return
    ecgpos_die "$name=$value is neither a file nor a shipped config in $ECGPOS_REPO/configs"
}

# ecgpos_words NAME ARRAY: the words of the list setting $NAME (ECGPOS_PRETRAIN_SET, ECGPOS_*_ARGS,
# ECGPOS_SBATCH_ARGS, ECGPOS_PROBE_TASKS, ECGPOS_CORPORA, ECGPOS_PROBE_ENCODERS) into the array ARRAY, split
# as a shell splits a command line: blanks separate words; quotes or a backslash keep a blank inside one
# ("--cache-dir '/scratch/my cache'").
# Nothing in the value is expanded or run ($HOME, *, $(...) stay as written). An unclosed quote is one line
# naming $NAME, exit 2.
ecgpos_words() {
    local name=$1 value=${!1:-} quoted
    local -n _ecgpos_words_out=$2
    _ecgpos_words_out=()
    if [[ $value != *[\"\'\\]* ]]; then   # no quoting: plain splitting on blanks, without Python
        read -r -d '' -a _ecgpos_words_out <<< "$value" || true
        return 0
    fi
    command -v python3 >/dev/null || ecgpos_die "$name: reading its quotes needs python3 on PATH"
    # Python's shlex reads the quotes as POSIX shells do and writes each word back single-quoted, which
    # the eval below turns into exactly those words and nothing else.
    quoted=$(python3 -c '
import shlex, sys
try:
    print(" ".join(shlex.quote(word) for word in shlex.split(sys.argv[1])))
except ValueError as err:
    print(f"{err} in {sys.argv[1]!r}")
    sys.exit(2)
' "$value") || ecgpos_die "$name: $quoted"
    eval "_ecgpos_words_out=($quoted)"
}

# Probe task names `ecgpos probe --task` knows (probes/shared/tasks.py), besides custom:<dir>.
ECGPOS_KNOWN_PROBE_TASKS="ptbxl-super ptbxl-sub ptbxl-form ptbxl-rhythm cpsc2018 csn"
# ecgpos_require_probe_tasks: each word of ECGPOS_PROBE_TASKS is a known task or custom:<existing folder>.
ecgpos_require_probe_tasks() {
    local task tasks
    ecgpos_words ECGPOS_PROBE_TASKS tasks
    [ "${#tasks[@]}" -gt 0 ] || ecgpos_die "ECGPOS_PROBE_TASKS is empty"
    for task in "${tasks[@]}"; do
        case " $ECGPOS_KNOWN_PROBE_TASKS " in *" $task "*) continue ;; esac
        if [[ $task == custom:* ]]; then
            [ -d "${task#custom:}" ] || ecgpos_die "ECGPOS_PROBE_TASKS: $task is not a folder"
            continue
        fi
        ecgpos_die "ECGPOS_PROBE_TASKS: unknown task '$task' (known: $ECGPOS_KNOWN_PROBE_TASKS, custom:<dir>)"
    done
}

# Raw-corpus layouts `ecgpos preprocess` reads (preprocessing/build.py SOURCES) and its ecg-arrhythmia --subset.
ECGPOS_KNOWN_DATASETS="code15 ecg-arrhythmia"
ECGPOS_KNOWN_SUBSETS="all chapman ningbo"
# ecgpos_corpora DATASETS SOURCES SHARDS: the corpora to preprocess and pretrain on, as three arrays of one
# length: the dataset, its raw folder and its shard folder. ECGPOS_CORPORA ("ecg-arrhythmia=/data/ecg-arrhythmia
# code15=/data/code15", the paper's pool) gives one corpus per word, each into $ECGPOS_SHARDS/<dataset>/;
# without it, the one corpus ECGPOS_DATASET (ecg-arrhythmia) from ECGPOS_SRC goes into $ECGPOS_SHARDS itself.
# Raw folders are not checked here (a chain that starts at level0 needs none); pipeline.sh checks them.
ecgpos_corpora() {
    local -n _ecgpos_datasets=$1 _ecgpos_sources=$2 _ecgpos_shard_dirs=$3
    local corpora word dataset
    _ecgpos_datasets=() _ecgpos_sources=() _ecgpos_shard_dirs=()
    ecgpos_words ECGPOS_CORPORA corpora
    if [ "${#corpora[@]}" -eq 0 ]; then
        ECGPOS_CORPORA=""   # a blank value is no list: callers test [ -n "$ECGPOS_CORPORA" ]
        dataset=${ECGPOS_DATASET:-ecg-arrhythmia}
        [[ " $ECGPOS_KNOWN_DATASETS " == *" $dataset "* ]] ||
            ecgpos_die "ECGPOS_DATASET: unknown dataset '$dataset' (known: $ECGPOS_KNOWN_DATASETS)"
        _ecgpos_datasets=("$dataset") _ecgpos_sources=("${ECGPOS_SRC:-}") _ecgpos_shard_dirs=("$ECGPOS_SHARDS")
        ecgpos_require_subset "$dataset"
        return 0
    fi
    for word in ECGPOS_SRC ECGPOS_DATASET; do   # two answers to "which corpus": refuse rather than pick one
        [ -z "${!word:-}" ] || ecgpos_die "ECGPOS_CORPORA and $word are both set: ECGPOS_CORPORA lists every" \
            "corpus as dataset=path; unset $word"
    done
    for word in "${corpora[@]}"; do
        dataset=${word%%=*}
        [[ $word == *=* && -n $dataset && -n ${word#*=} ]] ||
            ecgpos_die "ECGPOS_CORPORA: '$word' is not dataset=path (e.g. code15=/data/code15)"
        [[ " $ECGPOS_KNOWN_DATASETS " == *" $dataset "* ]] ||
            ecgpos_die "ECGPOS_CORPORA: unknown dataset '$dataset' in '$word' (known: $ECGPOS_KNOWN_DATASETS)"
        [[ " ${_ecgpos_datasets[*]} " != *" $dataset "* ]] ||
            ecgpos_die "ECGPOS_CORPORA: $dataset is given twice (its shards go to $ECGPOS_SHARDS/$dataset)"
        _ecgpos_datasets+=("$dataset") _ecgpos_sources+=("${word#*=}") _ecgpos_shard_dirs+=("$ECGPOS_SHARDS/$dataset")
    done
    ecgpos_require_subset "${_ecgpos_datasets[@]}"
}
# ecgpos_require_subset DATASET...: ECGPOS_SUBSET, when set, is a subset of an ecg-arrhythmia corpus among them.
ecgpos_require_subset() {
    [ -n "${ECGPOS_SUBSET:-}" ] || return 0
    [[ " $ECGPOS_KNOWN_SUBSETS " == *" $ECGPOS_SUBSET "* ]] ||
        ecgpos_die "ECGPOS_SUBSET: unknown subset '$ECGPOS_SUBSET' (known: $ECGPOS_KNOWN_SUBSETS)"
    [[ " $* " == *" ecg-arrhythmia "* ]] ||
        ecgpos_die "ECGPOS_SUBSET=$ECGPOS_SUBSET is an ecg-arrhythmia id range, and no corpus is ecg-arrhythmia ($*)"
}

# ecgpos_probe_encoders ARRAY: the encoders to probe. ECGPOS_PROBE_ENCODER alone when set (one encoder, its
# probes in $ECGPOS_PROBES/<task>/), else the words of ECGPOS_PROBE_ENCODERS, by default level 1's level-0
# encoder and the run of every level above it up to ECGPOS_DEPTH - 1 (the paper's comparison at depth 2),
# each encoder's probes in $ECGPOS_PROBES/<name>/<task>/.
ecgpos_probe_encoders() {
    local -n _ecgpos_encoders=$1
    if [ -n "${ECGPOS_PROBE_ENCODER:-}" ]; then
        [ -z "${ECGPOS_PROBE_ENCODERS:-}" ] || ecgpos_die "ECGPOS_PROBE_ENCODER and ECGPOS_PROBE_ENCODERS are" \
            "both set: set ECGPOS_PROBE_ENCODER for one encoder or ECGPOS_PROBE_ENCODERS for several"
        _ecgpos_encoders=("$ECGPOS_PROBE_ENCODER")
        return 0
    fi
    ecgpos_words ECGPOS_PROBE_ENCODERS _ecgpos_encoders
    [ "${#_ecgpos_encoders[@]}" -eq 0 ] || return 0
    local _level
    _ecgpos_encoders=("${ECGPOS_LEVEL0_RUN:-$ECGPOS_RUNS/level0}")   # then each latent level's run
    for (( _level = 1; _level < ECGPOS_DEPTH; _level++ )); do _ecgpos_encoders+=("$ECGPOS_RUNS/level$_level"); done
}
# ecgpos_probe_name ENCODER: the folder name of an encoder's probes: the run or export folder's name
# (runs/level1 -> level1, the label `ecgpos probe` gives it), random-<config name> for random:<config>.
ecgpos_probe_name() {
    local encoder=$1 name
    if [[ $encoder == random:* ]]; then
        name=${encoder#random:}
        name=${name%/}
        name=${name##*/}
        echo "random-${name%.yaml}"
        return
    fi
    while [[ $encoder == */ && $encoder != / ]]; do encoder=${encoder%/}; done
    echo "${encoder##*/}"
}
# ecgpos_probe_out ENCODER TASK: where `ecgpos probe` writes ENCODER's results on TASK.
ecgpos_probe_out() {
    if [ -n "${ECGPOS_PROBE_ENCODER:-}" ]; then
        echo "$ECGPOS_PROBES/$2"
    else
        echo "$ECGPOS_PROBES/$(ecgpos_probe_name "$1")/$2"
    fi
}

# ecgpos_require_setup: ECGPOS_SETUP must be valid shell code (`bash -n`), or every job would fail at once.
# Files it sources (`source F`, `. F`) or runs by path that are missing here are noted, not refused: the jobs
# run it on the compute nodes, where node-local paths differ and the set-up may create its own files.
ecgpos_require_setup() {
    [ -n "${ECGPOS_SETUP:-}" ] || return 0
    local err note
    if ! err=$(bash -n -c "$ECGPOS_SETUP" 2>&1); then
        err=$(head -n 1 <<< "$err")
        ecgpos_die "ECGPOS_SETUP is not valid shell code (${err#bash: -c: })"
    fi
    command -v python3 >/dev/null || return 0   # the file check reads the code with Python's shlex
    python3 - "$ECGPOS_SETUP" <<'PY' 2>/dev/null | while IFS= read -r note; do
import os, shlex, sys

def path_here(word):  # the path as a shell here would see it; None when that takes running code
    path = os.path.expanduser(os.path.expandvars(word))
    return None if "$" in path or "`" in path else path

def check(words):
    while words and "=" in words[0] and not words[0].startswith("="):  # VAR=value before a command
        words = words[1:]
    if len(words) > 1 and words[0] in ("source", "."):
        path = path_here(words[1])
        if path is not None and not os.path.isfile(path):
            print(f"{words[0]} {words[1]}: no such file")
    elif words and "/" in words[0]:
        path = path_here(words[0])
        if path is not None and not os.path.isfile(path):
            print(f"{words[0]}: no such file")
        elif path is not None and not os.access(path, os.X_OK):
            print(f"{words[0]}: not executable (to read it into the job's shell: source {words[0]})")

for line in sys.argv[1].splitlines():
    if "$(" in line or "`" in line:  # command substitutions: what they expand to is known only when run
        continue
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.commenters = ""  # `#` starts a comment only at the start of a word, as in the shell: see below
    lexer.wordchars += "#"
    try:
        tokens = list(lexer)
    except ValueError:  # quoting shlex does not read as bash does: this line is left to the job
        continue
    comment = next((i for i, token in enumerate(tokens) if token.startswith("#")), len(tokens))
    words, guarded = [], False
    for token in tokens[:comment] + [";"]:  # a word starting with `#` begins a comment to the line's end
        if set(token) <= set(";&|()"):
            if words and not guarded:  # a command after && or || runs only when its guard allows
                check(words)
            words, guarded = [], token in ("&&", "||")
        else:
            words.append(token)
PY
        ecgpos_log "note: ECGPOS_SETUP: $note here (the jobs run it on the compute nodes)"
    done
}

# ecgpos_check_pretrain_config LEVEL: level LEVEL's config with the ECGPOS_PRETRAIN_SET overrides, resolved by
# `ecgpos pretrain --check-config` after the jobs' set-up (in a subshell): an unknown key or a bad value (exit 2)
# stops here with one line. Returns 1, having checked nothing, when no `ecgpos` with --check-config runs here
# (none on PATH, an older one, or one whose imports fail on this machine): the job then checks for itself.
ecgpos_check_pretrain_config() {
    local level=$1 var kv overrides out line rc=0
    if [ "$level" -eq 0 ]; then var=ECGPOS_LEVEL0_CONFIG; else var=ECGPOS_LATENT_CONFIG; fi
    local args=(pretrain --level "$level" --config "${!var}" --check-config)
    ecgpos_words ECGPOS_PRETRAIN_SET overrides
    for kv in "${overrides[@]}"; do args+=(--set "$kv"); done
    out=$(
        ECGPOS_DRY_RUN=1   # the set-up only, without its "not on PATH" refusal
        ecgpos_setup >/dev/null 2>&1 || true
        # importing torch creates its kernel cache folder: a check compiles nothing and leaves no work folder
        TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) && trap 'rm -rf "$TORCHINDUCTOR_CACHE_DIR"' EXIT
        command -v ecgpos >/dev/null || exit 127
        ecgpos pretrain --help 2>/dev/null | grep -q -- --check-config || exit 127
        ecgpos "${args[@]}" 2>&1 >/dev/null
    ) || rc=$?
    [ "$rc" -ne 0 ] || return 0
    [ "$rc" -eq 2 ] || return 1
    line=$(grep -m 1 '^ecgpos pretrain: error: ' <<< "$out" || tail -n 1 <<< "$out")
    ecgpos_die "level $level config $var=${!var}${ECGPOS_PRETRAIN_SET:+ with ECGPOS_PRETRAIN_SET=\"$ECGPOS_PRETRAIN_SET\"}:" \
        "${line#ecgpos pretrain: error: }"
}

# Environment set-up inside a job: ECGPOS_SETUP (any shell snippet, e.g. "module load cuda; source ~/venv/bin/activate")
# or, by default, the repository's .venv when it exists.
ecgpos_setup() {
    if [ -n "${ECGPOS_SETUP:-}" ]; then
        eval "$ECGPOS_SETUP"
    elif [ -z "${VIRTUAL_ENV:-}" ] && [ -f "$ECGPOS_REPO/.venv/bin/activate" ]; then
        # shellcheck disable=SC1091
        . "$ECGPOS_REPO/.venv/bin/activate"
    fi
    [ "$ECGPOS_DRY_RUN" = 1 ] || command -v ecgpos >/dev/null || ecgpos_die "ecgpos is not on PATH (set ECGPOS_SETUP)"
}

# Run (or, with ECGPOS_DRY_RUN=1, print) a command; arguments are shell-quoted when printed.
ecgpos_run() {
    if [ "$ECGPOS_DRY_RUN" = 1 ]; then
        printf '%q ' "$@"; echo
        return 0
    fi
    ecgpos_log "+ $(printf '%q ' "$@")"
    "$@"
}

# First host of a Slurm node list ("gpu[07-08,11],cpu01" -> gpu07). Uses scontrol when it works, else expands
# the first element itself (dry runs on machines without a Slurm configuration).
ecgpos_first_host() {
    local list=$1 host
    if host=$(scontrol show hostnames "$list" 2>/dev/null | head -n 1) && [ -n "$host" ]; then
        echo "$host"
        return
    fi
    local first=${list%%,*}
    if [[ $list =~ ^([^,\[]*)\[([^]]*)\] ]]; then
        local range=${BASH_REMATCH[2]}
        range=${range%%,*}
        first="${BASH_REMATCH[1]}${range%%-*}"
    fi
    echo "$first"
}

# Rendezvous port from the job id, so two jobs that share a head node do not collide (requeued jobs keep
# their id and get the same port back, their previous processes are gone by then).
ecgpos_port() { echo $(( 20000 + ${1:-0} % 20000 )); }

# True when a run folder says the run finished (run_info.json {"finished": true}).
ecgpos_run_finished() {
    local info=$1/run_info.json
    [ -f "$info" ] && python3 - "$info" <<'EOF'
import json, sys
try:
    sys.exit(0 if json.load(open(sys.argv[1])).get("finished") is True else 1)
except (OSError, ValueError):
    sys.exit(1)
EOF
}
