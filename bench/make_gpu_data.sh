#!/usr/bin/env bash
# Prepares, on a machine with the network and the sample data, what bench/gpu_check.sh needs on a GPU
# machine that has neither: gpu_data/shards (the 200 ecg-arrhythmia sample records, preprocessed),
# gpu_data/sample-data.tar.xz (all sample records, ~27 MB, so the real-data tests run there too) and
# .whl/ (wheels of the packages the GPU image lacks). Both folders are git-ignored; carry them.
#   bash bench/make_gpu_data.sh        (from the repository root; PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DATA=${ECGPOS_SAMPLE_DATA:-../shared/data}
rm -rf gpu_data
mkdir -p gpu_data
PYTHONPATH=$PWD "$PY" -m ecgpos preprocess ecg-arrhythmia --src "$DATA/ecg-arrhythmia" --subset all \
    --out gpu_data/shards --records-per-shard 64
tar -C "$DATA" -cf - . | xz -T0 -6 > gpu_data/sample-data.tar.xz
mkdir -p .whl
rm -f .whl/wfdb-*.whl .whl/neurokit2-*.whl .whl/pywavelets-*.whl .whl/PyWavelets-*.whl  # one version each
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    wfdb==4.3.1 neurokit2==0.2.13 PyWavelets==1.10.0
du -sh gpu_data .whl
