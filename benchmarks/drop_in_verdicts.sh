#!/usr/bin/env bash
# The 38 training scripts of tests/test_drop_in.py (the 34 `CONFIG_CASES`, LoRA, LoRA with KL at lr 1, four steps in
# fp32 and fp64: each clips on both sides, beta = 0 bit-identical to GRPOTrainer, beta = (0.5, 1) told apart), run
# with one virtualenv's TRL; prints one verdict per script and the versions.
# Usage: bash benchmarks/drop_in_verdicts.sh VENV [OUT.txt]
set -uo pipefail
cd "$(dirname "$0")/.."
venv="$1"; out="${2:-/dev/stdout}"
export PYTHONPATH="$PWD" HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
log=$(mktemp)
start=$(date +%s)
"$venv/bin/python" -m pytest -p no:cacheprovider -p no:randomly -rA tests/test_drop_in.py \
  -k "(test_same_outcome and not nothing_can_be_clipped) or test_peft_lora or test_two_rollout_batches" > "$log" 2>&1
rc=$?
{
  echo "# tests/test_drop_in.py's 38 training scripts, $(date '+%Y-%m-%d %H:%M'), $(lscpu | sed -n 's/^Model name: *//p')"
  "$venv/bin/python" -c "import torch, transformers, trl; print(f'torch {torch.__version__} | transformers {transformers.__version__} | trl {trl.__version__}')"
  echo "pytest exit $rc, $(( $(date +%s) - start )) s: $(tail -1 "$log")"
  grep -E '^(PASSED|FAILED|ERROR) ' "$log" | sed 's/^\(PASSED\|FAILED\|ERROR\) \(.*\)$/\1 \2/' | sort -k2
} > "$out"
rm -f "$log"
exit $rc
