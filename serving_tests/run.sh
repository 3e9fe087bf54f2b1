#!/usr/bin/env bash
# Build the engine venvs from the committed lock lists (skipped when up to date) and run the serving
# plugin tests against the real SGLang 0.5.23 and vLLM 0.33.0 code, on CPU.
# Usage: serving_tests/run.sh            (from anywhere; exits non-zero if any suite fails)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1

serving_tests/build_venvs.sh sglang vllm

rc=0
# the pure config tests need no engine; run them once, in the SGLang venv
.venv-sglang/bin/python -m pytest -q -p no:cacheprovider serving_tests/test_config.py serving_tests/test_plugin_config.py serving_tests/test_families.py serving_tests/sglang || rc=1
VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python -m pytest -q -p no:cacheprovider serving_tests/test_plugin_config.py serving_tests/test_families.py serving_tests/vllm || rc=1
exit "$rc"
