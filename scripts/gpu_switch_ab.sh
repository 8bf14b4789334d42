#!/usr/bin/env bash
# An A/B of compiler switches over every case set, in one call on the GPU machine (the device tool's
# `run`, `.gpu` carried): bench/census.py finds, on the CPU, the cases whose kernel sources each
# switch changes (every set in parallel), then bench/switch_ab.py times those cases on the GPU with
# the switch on and off, beside Inductor. Rows go to $OUT/ab.<switch>.jsonl; the censuses to
# $OUT/census.tgz. The A/Bs stop `BUDGET_S` seconds after the start (default 560); GPU_TESTS=1 then
# runs tests/gpu as well.
#
#   SWS="compiler.lowering.shapes.WRAPPED_PIECE_INDEX ..." [SETS="held_out ..."] bash scripts/gpu_switch_ab.sh
set -uo pipefail
source scripts/gpu_env.sh || exit 1
out="${OUT:-/tmp}"
sets=${SETS:-"cases held_out channels_last held_out_channels_last held_out_2 held_out_2_channels_last held_out_3 held_out_3_images held_out_4_images held_out_5 held_out_5_images"}
nvidia-smi --query-gpu=name --format=csv,noheader || true
start=$(date +%s)
for sw in $SWS; do
    mkdir -p "$out/census/$sw"
    for s in $sets; do
        python3 bench/census.py "$sw" "bench/$s" --json "$out/census/$sw/$s.json" >"$out/census/$sw/$s.log" 2>&1 &
    done
done
wait
echo "census took $(( $(date +%s) - start )) s"
for sw in $SWS; do echo "== $sw"; cat "$out/census/$sw"/*.log | grep -v Warning; done
for sw in $SWS; do
    for s in $sets; do
        names=$(python3 -c "import json; print(','.join(next(iter(json.load(open('$out/census/$sw/$s.json')).values()))))")
        [ -n "$names" ] || continue
        left=$(( ${BUDGET_S:-560} - ($(date +%s) - start) ))
        [ "$left" -gt 20 ] || break
        timeout --signal=INT "$left" python3 bench/switch_ab.py "$sw" "$names" "$out/ab.$sw.jsonl" "bench/$s" 2>&1 \
            | grep -v "Warning\|warn(" | tail -40
    done
done
(cd "$out" && tar czf census.tgz census && rm -rf census)
if [ "${GPU_TESTS:-0}" = 1 ]; then
    python3 -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -8 | tee "$out/gpu_tests.txt"
fi
