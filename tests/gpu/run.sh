#!/usr/bin/env bash
# The GPU suite, on a machine with a CUDA GPU and nvcc (the H100/H200 device): builds the Marlin FP4
# kernels of every release the engine table serves (test equipment: vLLM 0.33.0's from
# ../shared/marlin-kernels, 0.34.0's from ../shared/marlin-kernels-0.34, SGLang 0.5.23's JIT ops through
# SGLang's own JIT loader from .sglang-kernels/; a checkout's git-ignored copies .marlin-kernels/,
# .marlin-kernels-0.34/ and .sglang-kernels/ are used first, as on the device), in parallel,
# and runs tests/gpu once against each build: their op schemas differ (0.34.0 dropped `a_scales` and
# `is_a_8bit`; SGLang's ops have their own argument list), and validate --kernel must work with each.
# The sglang build runs the SGLang-target cases on SGLang's own kernel (--kernel-provider sglang) and compares
# it with vLLM 0.33.0's kernel on the same bytes, so VERSIONS=sglang builds 0.33 beside it.
# SGLang compiles one nvcc unit per activation dtype (about 250 s on the 16-core H100 box, both at once):
# SGLANG_JIT_CACHE_SEED=FILE.tar.gz unpacks an earlier build's cache of the same device image first (SGLang's
# own cache: it reuses a build only where its key, over sources, flags, compiler and packages, matches).
# Prepare .sglang-kernels/ on a developer machine with `python tests/gpu/sglang_kernels/prepare.py` (SGLang's files
# from .venv-sglang, checked against SOURCES.sha256; tests/gpu/sglang_kernels/README.md) and carry it to the
# device; without it the sglang build falls back to ../shared/sglang-kernels-0.5.23 where that exists.
# Usage: tests/gpu/run.sh [pytest args]; VERSIONS="0.34" picks builds, TESTS="tests/gpu/test_x.py ..." picks
# files (default: all of tests/gpu); results go to $OUT/<version>/ (or ./gpu-results/<version>/).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
pick() { [[ -d "$1" ]] && echo "$1" || echo "$2"; }
declare -A KERNELS=([0.33]=${KERNELS_033:-$(pick .marlin-kernels ../shared/marlin-kernels)}
                    [0.34]=${KERNELS_034:-$(pick .marlin-kernels-0.34 ../shared/marlin-kernels-0.34)}
                    [sglang]=${KERNELS_SGLANG:-$(pick .sglang-kernels ../shared/sglang-kernels-0.5.23)})
declare -A MODULE_GLOB=([0.33]="${MARLIN_BUILD_DIR:=/tmp/vllm_marlin_fp4}/ninja/vllm_marlin_fp4.*so"
                        [0.34]="${MARLIN_034_BUILD_DIR:=/tmp/vllm_marlin_fp4_034}/ninja/vllm_marlin_fp4_034*.so")
export SGLANG_MARLIN_BUILD_DIR=${SGLANG_MARLIN_BUILD_DIR:-/tmp/sglang_marlin_0523}
export SGLANG_JIT_CACHE_DIR=${SGLANG_JIT_CACHE_DIR:-$SGLANG_MARLIN_BUILD_DIR/jit-cache}
export MARLIN_BUILD_DIR MARLIN_034_BUILD_DIR
VERSIONS=${VERSIONS:-0.33 0.34}
BUILDS=$VERSIONS
[[ " $VERSIONS " == *" sglang "* && " $VERSIONS " != *" 0.33 "* ]] && BUILDS="$BUILDS 0.33"  # the comparison kernel
OUTDIR=$(realpath -m "${OUT:-gpu-results}")
mkdir -p "$OUTDIR"
t0=$SECONDS
# default seed: the cache the equipment folder carries from an earlier device run (a stale one is only rebuilt)
: "${SGLANG_JIT_CACHE_SEED:=$(ls "$ROOT/${KERNELS[sglang]}"/jit-cache-*.tgz 2>/dev/null | head -1)}"
if [[ " $BUILDS " == *" sglang "* && -n "$SGLANG_JIT_CACHE_SEED" && -f "$SGLANG_JIT_CACHE_SEED" ]]; then
  mkdir -p "$SGLANG_JIT_CACHE_DIR" && tar xzf "$SGLANG_JIT_CACHE_SEED" -C "$SGLANG_JIT_CACHE_DIR"
fi
for v in $BUILDS; do  # the builds run in parallel (about 70 s for both vLLM ones on 16 cores, 250 s for SGLang's)
  mkdir -p "$OUTDIR/$v" && python3 "$ROOT/${KERNELS[$v]}/build.py" >"$OUTDIR/$v/build.log" 2>&1 &
done
wait
for v in $BUILDS; do grep -h "^\[build\]" "$OUTDIR/$v/build.log" || tail -5 "$OUTDIR/$v/build.log"; done
echo "[gpu] kernels built in $((SECONDS - t0)) s"
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
tests=()
for t in ${TESTS:-tests/gpu}; do tests+=("$ROOT/$t"); done
run_version() {  # one pytest process per build, in parallel: the cases are small, the device has 16 cores
  local v=$1
  shift
  if [[ $v == sglang ]]; then  # SGLang's own ops (its JIT cache is built); vLLM 0.33.0's for the comparison
    export DSV4_KERNEL_ENGINE=sglang
    export PYTHONPATH=$(sed -n 's/^PYTHONPATH=//p' "$OUTDIR/sglang/build.log")${PYTHONPATH:+:$PYTHONPATH}
    DSV4_MARLIN_MODULE=$(ls ${MODULE_GLOB[0.33]} 2>/dev/null | head -1)
  else
    DSV4_MARLIN_MODULE=$(ls ${MODULE_GLOB[$v]} | head -1)
  fi
  export DSV4_MARLIN_MODULE DSV4_GPU_RESULTS="$OUTDIR/$v/gpu_results.jsonl"
  rm -f "$DSV4_GPU_RESULTS"
  echo "[gpu] $v kernels: ${DSV4_KERNEL_ENGINE:-$DSV4_MARLIN_MODULE}"
  # --import-mode=append: the root (tests/ is a package) goes after the package view on sys.path;
  # --dist loadgroup (with -n): a module whose fixture runs many CLI processes stays on one worker (xdist_group)
  local dist=()
  [[ " $* " == *" -n "* || " $* " == *" --numprocesses"* ]] && dist=(--dist loadgroup)
  python3 -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=append --rootdir "$ROOT" \
    --basetemp "/tmp/gpu-tests-$v" "${dist[@]}" "${tests[@]}" "$@"
}
declare -A pids
for v in $VERSIONS; do
  run_version "$v" "$@" >"$OUTDIR/$v/pytest.log" 2>&1 &
  pids[$v]=$!
done
rc=0
for v in $VERSIONS; do
  wait "${pids[$v]}" || rc=1
  echo "== tests/gpu with the $v kernels ($((SECONDS - t0)) s since start)"
  cat "$OUTDIR/$v/pytest.log"
done
exit "$rc"
