#!/usr/bin/env bash
# CI step for vLLM generation on CPU: build the vLLM venv (.ci/vllm_venv.sh) and run tests/test_vllm.py in it.
# Measured on the 2-core CI machine kind (shared with other jobs): see docs/vllm.md.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${CEGPPO_VLLM_VENV:-/tmp/cegppo-vllm-venv}"
bash .ci/vllm_venv.sh "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=2
# -p no:cacheprovider: CI's clone may be read-only; the test writes only under pytest's tmp_path.
python -m pytest tests/test_vllm.py -p no:cacheprovider -rs
