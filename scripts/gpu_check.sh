#!/usr/bin/env bash
# The whole GPU check in one go, on the GPU machine (the device tool's `run`, with `.gpu` carried):
# the GPU tests (their summary also in $OUT/gpu_tests.txt), the host-overhead benchmark, then
# bench/models.py (arguments go to it; none: skipped).
# JSON results land in $OUT.
set -uo pipefail
source scripts/gpu_env.sh
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader || true
python3 -m pytest -q -x tests/gpu -p no:cacheprovider 2>&1 | tail -5 | tee "$out/gpu_tests.txt"
python3 bench/host_overhead.py --json "$out/host_overhead.json" 2>&1 | grep -v Warning
if [ $# -gt 0 ]; then python3 bench/models.py --json "$out/models.json" "$@" 2>&1 | grep -v "Warning\|warn("; fi
