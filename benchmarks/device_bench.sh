#!/usr/bin/env bash
# The whole conversion table (benchmarks/bench_convert.py) on the GPU box, in about 7 minutes: the
# small conversion cold and warm, start-up on header sets of 8 and 43 layers, then 8 real-size layers
# (29 GB, or what /dev/shm holds) in shards of 1 GiB (32 shards) and 4 GiB (8 shards), CPU route x
# workers, beside a single-stream and a parallel copy. The box has no network and no install of this
# project: its python3 has numpy, numba, xxhash, click, tqdm, safetensors and torch, and the package
# is a view of this tree made from pyproject's package-dir (as tests/gpu/run.sh makes it).
# Usage: benchmarks/device_bench.sh [LAYERS]   (default auto: as many as /dev/shm holds, at most 8);
# BENCH_ARGS="--experts 4 --header-layers 2" appends arguments to every part (a quick check of this script);
# PARTS="4" runs only the 4 GiB-shard part (PARTS="1" only the 1 GiB one; default both).
# Output: $OUT/bench_convert.txt (or ./bench-results/); each part has a time limit, so a slow box
# still returns what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUTDIR=$(realpath -m "${OUT:-bench-results}")
LAYERS=${1:-auto}
WORK=/dev/shm/dsv4-bench
mkdir -p "$OUTDIR"
LOG="$OUTDIR/bench_convert.txt"
if ! python3 -c 'import dsv4_convert.core' 2>/dev/null; then  # no install here: a package view of the tree
  rm -rf /tmp/dsv4pkg && ROOT=$ROOT python3 - <<'PY'
import os, shutil, tomllib
root = os.environ["ROOT"]
for pkg, folder in tomllib.load(open(f"{root}/pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"].items():
    shutil.copytree(f"{root}/{folder}", "/tmp/dsv4pkg/" + pkg.replace(".", "/"), dirs_exist_ok=True)
PY
  export PYTHONPATH=/tmp/dsv4pkg${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c 'import numba, xxhash, click, tqdm, safetensors, dsv4_convert.core' || exit 1
export PYTHONUNBUFFERED=1
part() {  # part SECONDS ARGS...: one bench_convert run under a time limit, in a fresh work folder
  local limit=$1
  shift
  rm -rf "$WORK" && mkdir -p "$WORK"
  timeout -k 10 "$limit" python3 "$ROOT/benchmarks/bench_convert.py" --dir "$WORK" "$@" ${BENCH_ARGS:-} 2>&1 | tee -a "$LOG"
  echo "[device_bench] part exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$LOG"
  rm -rf "$WORK"
}
: >"$LOG"
PARTS=${PARTS:-1 4}  # which shard sizes (GiB) to run: PARTS=4 re-times the 4 GiB table alone
[[ " $PARTS " == *" 1 "* ]] && part 230 --layers "$LAYERS" --shard-gib 1 --workers auto 4 8 12 --repeat 2 --copies 2
[[ " $PARTS " == *" 4 "* ]] && part 190 --layers "$LAYERS" --shard-gib 4 --workers auto 4 8 16 --repeat 2 --copies 2 --skip-small
echo "[device_bench] done in $SECONDS s" | tee -a "$LOG"
