#!/usr/bin/env bash
# The GPU suite, on a machine with a CUDA GPU and nvcc (the H200 device): builds vLLM 0.33.0's Marlin
# FP4 kernels (test equipment from ../shared/marlin-kernels, or KERNELS=path) and runs tests/gpu
# against them. Usage: tests/gpu/run.sh [pytest args]; results go to $OUT (or ./gpu-results).
set -euo pipefail
cd "$(dirname "$0")/../.."
KERNELS=${KERNELS:-../shared/marlin-kernels}
ROOT=$(pwd)
OUTDIR=$(realpath -m "${OUT:-gpu-results}")
mkdir -p "$OUTDIR"
export MARLIN_BUILD_DIR=${MARLIN_BUILD_DIR:-/tmp/vllm_marlin_fp4}
python3 "$KERNELS/build.py" | tee "$OUTDIR/build.log"
DSV4_MARLIN_MODULE=$(ls "$MARLIN_BUILD_DIR"/ninja/vllm_marlin_fp4*.so | head -1)
export DSV4_MARLIN_MODULE DSV4_GPU_RESULTS="$OUTDIR/gpu_results.jsonl"
rm -f "$DSV4_GPU_RESULTS"
# Python runs from /tmp: in the repository root, ./dsv4_convert (the version alone) shadows the package
cd /tmp
if ! python3 -c 'import dsv4_convert.core' 2>/dev/null; then  # no install on the device: a package view of the tree
  rm -rf /tmp/dsv4pkg && ROOT=$ROOT python3 - <<'PY'  # pyproject's package-dir is the one home of the folder mapping
import shutil, tomllib
import os
root = os.environ["ROOT"]
for pkg, folder in tomllib.load(open(f"{root}/pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"].items():
    shutil.copytree(f"{root}/{folder}", "/tmp/dsv4pkg/" + pkg.replace(".", "/"), dirs_exist_ok=True)
PY
  export PYTHONPATH=/tmp/dsv4pkg${PYTHONPATH:+:$PYTHONPATH}
fi
# --import-mode=append: the root (tests/ is a package) goes after the package view on sys.path
python3 -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=append --rootdir "$ROOT" "$ROOT/tests/gpu" "$@" 2>&1 | tee "$OUTDIR/pytest.log"
