#!/usr/bin/env bash
# Build the engine venvs from the committed lock lists (skipped when up to date) and run the serving
# plugin tests against the real SGLang 0.5.23 and vLLM 0.33.0 code, on CPU. The two engines' suites
# run at the same time (two processes, one per engine: on 2 cores that halves the wait); each suite's
# output is printed whole when it ends, so the two never interleave.
# Usage: serving_tests/run.sh            (from anywhere; exits non-zero if any suite fails)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1

serving_tests/build_venvs.sh sglang vllm

# the engine venvs have no pytest-xdist: keep the core suite's addopts (-n auto) out of these runs
PYTEST=(-m pytest -q -p no:cacheprovider -o addopts=-ra)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# the pure config tests need no engine; run them once, in the SGLang venv
.venv-sglang/bin/python "${PYTEST[@]}" serving_tests/test_config.py serving_tests/test_plugin_config.py \
  serving_tests/test_families.py serving_tests/sglang >"$logs/sglang" 2>&1 &
sglang=$!
VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python "${PYTEST[@]}" serving_tests/test_plugin_config.py \
  serving_tests/test_families.py serving_tests/vllm >"$logs/vllm" 2>&1 &
vllm=$!

rc=0
for engine in sglang vllm; do
  pid=${!engine}
  if wait "$pid"; then result=passed; else result=FAILED; rc=1; fi
  echo "== serving_tests ($engine): $result"
  cat "$logs/$engine"
done
exit "$rc"
