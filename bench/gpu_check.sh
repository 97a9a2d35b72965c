#!/usr/bin/env bash
# The GPU measurements and the test suite on a CUDA machine, in one call of BUDGET seconds (560: ~9.5 min).
# Needs (carried, git-ignored; built by bench/make_gpu_data.sh): gpu_data/ and .whl/. The sample
# records in gpu_data/sample-data.tar.xz are unpacked for the test suite ($ECGPOS_SAMPLE_DATA).
#   bash bench/gpu_check.sh                      (from the repository root; logs under $OUT or gpu_out/)
# Every step has its own timeout, cut to what is left of BUDGET seconds, so one hang cannot eat the
# call; the summary table comes last. Knobs (for a dry run on a CPU): CONFIGS, BATCH, STEPS, WARMUP,
# E2E_STEPS, WORKERS, BUDGET, PYTEST_EXTRA and PYTEST_GPU_EXTRA (more pytest arguments), PYTEST_PATHS (what it runs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
SUMMARY=$OUT/summary.txt
PY=${PYTHON:-python3}
CONFIGS=${CONFIGS:-configs/level0.yaml configs/level1.yaml}
BATCH=${BATCH:-64}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-5}
E2E_STEPS=${E2E_STEPS:-400}
WORKERS=${WORKERS:-6}
BUDGET=${BUDGET:-560}
PYTEST_EXTRA=${PYTEST_EXTRA--n 14 --dist loadfile}  # pytest-xdist is in the GPU image; a file per worker keeps module fixtures built once
PYTEST_GPU_EXTRA=${PYTEST_GPU_EXTRA--n 4}  # the four GPU checks side by side: three short ones beside the compile
# -rP: each GPU check's own "ok ..." line (its figure) goes to the log
PYTEST_PATHS=${PYTEST_PATHS:-tests}
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
: > "$LOG"
printf '%-34s %5s %6s  %s\n' step rc secs result > "$SUMMARY"

# The suite runs ecgpos as an installed user does: wfdb & co. in the interpreter's environment (tests that
# start subprocesses with their own PYTHONPATH would not see wheels unpacked elsewhere), the checkout importable
# from any process (a .pth file, as an editable install writes) and `ecgpos` on PATH. On a bare, lent
# machine that environment is the image's; where these are present already (a dry run), nothing is written.
# A failed install is a summary row: the tests that need wfdb would otherwise fail for no visible reason.
if ! "$PY" -c "import wfdb, neurokit2" > /dev/null 2>&1 && ls .whl/*.whl > /dev/null 2>&1; then
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl >> "$LOG" 2>&1; then
        printf '%-34s %5s %6s  %s\n' "install .whl" 1 0 "failed (see $LOG); running without them" >> "$SUMMARY"
    fi
fi
SCRIPTS=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["scripts"])')
if ! (cd / && env -u PYTHONPATH "$PY" -c "import ecgpos" > /dev/null 2>&1) || [ ! -x "$SCRIPTS/ecgpos" ]; then
    "$PY" - "$PWD" << 'INSTALL' >> "$LOG" 2>&1 || printf '%-34s %5s %6s  %s\n' "install ecgpos" 1 0 "failed (see $LOG)" >> "$SUMMARY"
import sys
import sysconfig
from pathlib import Path

Path(sysconfig.get_paths()["purelib"], "ecgpos-checkout.pth").write_text(sys.argv[1] + "\n")
script = Path(sysconfig.get_paths()["scripts"], "ecgpos")
script.write_text(f'#!/bin/sh\nexec {sys.executable} -m ecgpos "$@"\n')
script.chmod(0o755)
print("ecgpos installed from", sys.argv[1], "as", script)
INSTALL
fi
export PATH=$SCRIPTS:$PATH

if [ -f gpu_data/sample-data.tar.xz ] && [ -z "${ECGPOS_SAMPLE_DATA:-}" ]; then
    if mkdir -p /tmp/ecgpos-sample-data &&
        tar -C /tmp/ecgpos-sample-data -xJf gpu_data/sample-data.tar.xz >> "$LOG" 2>&1; then
        export ECGPOS_SAMPLE_DATA=/tmp/ecgpos-sample-data
    else  # the real-data tests would skip
        printf '%-34s %5s %6s  %s\n' "unpack sample data" 1 0 "failed (see $LOG); real-data tests skip" >> "$SUMMARY"
    fi
fi

# step NAME CAP_SECONDS RESULT_PATTERN COMMAND...: run with timeout min(CAP, time left); log; one summary row
step() {
    local name=$1 cap=$2 pattern=$3; shift 3
    local left=$((BUDGET - ($(date +%s) - START)))
    local limit=$((cap < left ? cap : left))
    if ((limit < 20)); then
        printf '%-34s %5s %6s  %s\n' "$name" skip 0 "no time left" >> "$SUMMARY"
        return
    fi
    echo "=== $name (timeout ${limit}s): $*" | tee -a "$LOG"
    local t0
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/step.tmp" | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    local result
    result=$(grep -E "$pattern" "$OUT/step.tmp" | tail -1 | cut -c1-400)
    printf '%-34s %5s %6s  %s\n' "$name" "$rc" $(($(date +%s) - t0)) "${result:-(see $LOG)}" >> "$SUMMARY"
    rm -f "$OUT/step.tmp"
}

step "nvidia-smi" 90 "GPU|torch" bash -c "nvidia-smi -L; $PY -c 'import torch; print(\"torch\", torch.__version__, torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else \"no cuda\")'"
SHARDS=gpu_data/shards
read -r -a configs <<< "$CONFIGS"
e2e=()
[ -d "$SHARDS" ] && e2e=(--e2e "$SHARDS" --e2e-steps "$E2E_STEPS" --set "train.num_workers=$WORKERS")
# Most wanted first, so a short budget drops the reference runs, not the tests or the figures. The GPU
# checks get a step of their own, on an idle machine (113 s there on an H100): their compiled run compiles cold, and
# started among the suite's workers it did not end within 185 s. Then the rest of the suite, every
# failure listed (no -x).
# shellcheck disable=SC2086  # PYTEST_EXTRA and PYTEST_PATHS are lists of arguments
if [ -z "${SKIP_PYTEST:-}" ]; then
    step "pytest GPU checks" 300 "passed|failed|error|skipped" "$PY" -m pytest -q -rP -p no:cacheprovider \
        $PYTEST_GPU_EXTRA tests/test_train_cuda.py
    step "pytest" 300 "passed|failed|error|skipped" "$PY" -m pytest -q -m "not slurm" -p no:cacheprovider \
        --ignore=tests/test_train_cuda.py $PYTEST_EXTRA $PYTEST_PATHS
fi
# train.compile=auto, the default: CUDA graphs (reduce-overhead) on one GPU; bare step and end to end. A cold
# compile of a paper config takes minutes (over 150 s for level 0 on an H100), hence the caps.
run_config() {  # run_config CONFIG: the auto row
    step "$(basename "$1" .yaml) auto b$BATCH +e2e" 300 "^train_step" "$PY" bench/train_step.py \
        --config "$1" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" "${e2e[@]}"
}
run_config "${configs[0]}"
bare0=$(grep -E "^train_step level=0 .*compile=reduce-overhead" "$LOG" | tail -1 |
    sed -E 's/.* step_ms=[0-9.]+ samples_per_s=([0-9.]+).*/\1/')
if [ -d "$SHARDS" ]; then
    step "loader workers 4 6 8 12" 60 "^loader" "$PY" bench/loader.py --shards "$SHARDS" --workers 4 6 8 12 \
        --batch "$BATCH" --batches 300 ${bare0:+--train-samples-per-s "$bare0"}
fi
for config in "${configs[@]:1}"; do run_config "$config"; done
# the cost of depth, compiled as the default compiles: a level-2 step beside a level-1 step of the same config
for config in "${configs[@]:1}"; do
    step "$(basename "$config" .yaml) level 2 auto b$BATCH" 300 "^train_step" "$PY" bench/train_step.py \
        --config "$config" --level 2 --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP"
done
# eager: the reference the compiled step is compared with
for config in "${configs[@]}"; do
    step "$(basename "$config" .yaml) eager b$BATCH +e2e" 150 "^train_step" "$PY" bench/train_step.py \
        --config "$config" --batch "$BATCH" --set train.compile=false --steps "$STEPS" --warmup "$WARMUP" "${e2e[@]}"
done
printf 'total %ss\n' $(($(date +%s) - START)) >> "$SUMMARY"
echo
cat "$SUMMARY"
