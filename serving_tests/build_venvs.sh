#!/usr/bin/env bash
# Build the engine test venvs from the committed lock lists (serving_tests/locks/ENGINE-VERSION-cpu-test.lock):
#   .venv-vllm       vLLM 0.34.0   (the newest release: CI's)
#   .venv-vllm-0.33  vLLM 0.33.0   (the older supported release: serving_tests/run.sh --matrix)
#   .venv-sglang     SGLang 0.5.23
# The versions must be releases of core/targets/engines.py's table (tests/core/test_engine_table.py checks that
# every lock file names one). Idempotent: a venv whose stamp matches the lock file and pins is left as is.
# Never lets pip resolve an engine's own requirements (CUDA torch, flashinfer, ...): --no-deps.
# Usage: serving_tests/build_venvs.sh [vllm|vllm-0.33|sglang|all]...   (default: vllm sglang, the newest)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCKS="$ROOT/serving_tests/locks"
PY="${PYTHON:-python3}"
TORCH="torch==2.13.0"

build() {
  local name="$1" pin="$2" lock="$3"
  local venv="$ROOT/.venv-$name"
  local stamp="$venv/.dsv4-stamp"
  local want
  want="$( (echo "$TORCH $pin"; cat "$LOCKS/$lock") | sha256sum | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    # the project itself is an editable install, so only re-link it (fast) in case pyproject changed
    "$venv/bin/python" -m pip install -q -e "$ROOT" --no-deps
    echo "[build_venvs] $name: up to date"
    return
  fi
  local t0=$SECONDS
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "$TORCH"                       # CPU build (local wheel)
  "$venv/bin/python" -m pip install -q --no-deps "$pin"
  "$venv/bin/python" -m pip install -q --no-deps -r "$LOCKS/$lock"
  "$venv/bin/python" -m pip install -q --no-deps pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1
  "$venv/bin/python" -m pip install -q -e "$ROOT" --no-deps
  echo "$want" > "$stamp"
  echo "[build_venvs] $name: built in $((SECONDS - t0)) s"
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(vllm sglang)
[[ "${targets[*]}" == all ]] && targets=(vllm vllm-0.33 sglang)
for t in "${targets[@]}"; do
  case "$t" in
    vllm)      build vllm      vllm==0.34.0   vllm-0.34.0-cpu-test.lock ;;
    vllm-0.33) build vllm-0.33 vllm==0.33.0   vllm-0.33.0-cpu-test.lock ;;
    sglang) build sglang sglang==0.5.23 sglang-0.5.23-cpu-test.lock ;;
    *) echo "unknown engine: $t" >&2; exit 2 ;;
  esac
done
