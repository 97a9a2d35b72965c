#!/usr/bin/env bash
# Prepares, on a machine with the network and the sample data, what bench/gpu_check.sh needs on a GPU
# machine that has neither: gpu_data/shards (the 200 ecg-arrhythmia sample records, preprocessed)
# and .whl/ (wheels of the packages the GPU image lacks). Both are git-ignored; carry them.
#   bash bench/make_gpu_data.sh        (from the repository root; PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SRC=${ECGPOS_SAMPLE_DATA:-../shared/data}/ecg-arrhythmia
rm -rf gpu_data
mkdir -p gpu_data
PYTHONPATH=$PWD "$PY" -m ecgpos preprocess ecg-arrhythmia --src "$SRC" --subset all --out gpu_data/shards \
    --records-per-shard 64
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    wfdb==4.3.1 neurokit2==0.2.13 PyWavelets==1.10.0
du -sh gpu_data .whl
