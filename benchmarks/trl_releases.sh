#!/usr/bin/env bash
# The seam's tests, TRL's aggregation rule, the trainer-gradient tests and the differential suite against each TRL
# release of the pin, one after the other in one virtualenv (docs/maintaining.md, "Supported TRL releases").
# Usage: bash benchmarks/trl_releases.sh VENV [RELEASE ...]   (VENV: a virtualenv with this package's test extra;
# its own `python -m pip` installs each release with --no-deps, so nothing else in it changes)
set -uo pipefail
cd "$(dirname "$0")/.."
venv="$1"; shift
releases=("${@:-1.10.0 1.11.0 1.12.0 1.13.0 1.14.0 1.16.0}")
export PYTHONPATH="$PWD" HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
for v in ${releases[@]}; do
  "$venv/bin/python" -m pip install -q --no-deps "trl==$v" >/dev/null 2>&1 || { echo "trl $v: install failed"; continue; }
  start=$(date +%s)
  "$venv/bin/python" -m pytest -q -p no:randomly -p no:cacheprovider tests/test_trl_seam.py tests/test_loss.py \
    tests/test_trainer.py tests/test_drop_in.py > "/tmp/trl_releases-$v.log" 2>&1
  rc=$?
  echo "trl $v: exit $rc, $(( $(date +%s) - start )) s, $(grep -cE '^(FAILED|ERROR)' "/tmp/trl_releases-$v.log") failed"
done
