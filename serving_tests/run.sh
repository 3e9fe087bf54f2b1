#!/usr/bin/env bash
# Build the engine venvs from the committed lock lists (skipped when up to date) and run the serving
# plugin tests against the real engine code, on CPU:
#   serving_tests/run.sh            the newest releases: SGLang 0.5.23 (.venv-sglang), vLLM 0.34.0 (.venv-vllm)
#   serving_tests/run.sh --matrix   every release the engine table serves: the above and vLLM 0.33.0 (.venv-vllm-0.33)
# (serving_tests/build_venvs.sh names the venvs; tests/core/test_engine_table.py checks that the lock files
# and the table's releases agree.) The suites run at the same time, one process per engine release (on 2
# cores that halves the wait); each suite's output is printed whole when it ends, so they never interleave.
# Exits non-zero if any suite fails.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1

venvs=(sglang vllm)
[[ "${1:-}" == "--matrix" ]] && venvs+=(vllm-0.33)
serving_tests/build_venvs.sh "${venvs[@]}"

# the engine venvs have no pytest-xdist: keep the core suite's addopts (-n auto) out of these runs
PYTEST=(-m pytest -q -p no:cacheprovider -o addopts=-ra)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
suite() {  # one engine release's tests; its duration goes beside its log
  local venv=$1 start=$SECONDS rc=0
  case "$venv" in
    # the pure config tests need no engine; run them once, in the SGLang venv
    sglang) .venv-sglang/bin/python "${PYTEST[@]}" serving_tests/test_config.py serving_tests/test_plugin_config.py \
              serving_tests/test_families.py serving_tests/test_differential.py serving_tests/test_draft_differential.py \
              serving_tests/test_engine_refusals.py serving_tests/sglang || rc=$? ;;
    vllm*)  VLLM_TARGET_DEVICE=cpu ".venv-$venv/bin/python" "${PYTEST[@]}" serving_tests/test_plugin_config.py \
              serving_tests/test_families.py serving_tests/test_differential.py serving_tests/test_draft_differential.py \
              serving_tests/test_engine_refusals.py serving_tests/vllm || rc=$? ;;
  esac
  echo $((SECONDS - start)) >"$logs/$venv.seconds"
  return "$rc"
}
declare -A pids
for venv in "${venvs[@]}"; do
  suite "$venv" >"$logs/$venv" 2>&1 &
  pids[$venv]=$!
done

rc=0
for venv in "${venvs[@]}"; do
  if wait "${pids[$venv]}"; then result=passed; else result=FAILED; rc=1; fi
  version=$(".venv-$venv/bin/python" -c "import importlib.metadata as m; print(m.version('${venv%%-*}'))")
  echo "== serving_tests (${venv%%-*} $version, .venv-$venv): $result in $(cat "$logs/$venv.seconds") s"
  cat "$logs/$venv"
done
exit "$rc"
