#!/usr/bin/env bash
# bench/kernels.py over whole case sets, sharded over every GPU of the machine (the device tool's
# `run`, `.gpu` carried): one process per GPU takes every n-th case of each set, so four GPUs
# time a set in a quarter of the time. Each GPU times its own cases side by side with Inductor,
# as one process would. Rows go to .bench-runs/<set>.<gpu>.jsonl as measured. A run stops taking
# new cases `BENCH_DEADLINE_S` after it starts (default 540 s); BENCH_RESUME=1 then goes on from the
# rows already there (the same command, on the same warm machine), where without it a run starts
# afresh. At the end each set's rows are merged into $OUT/<set>.jsonl and its table printed.
# BENCH_GPUS="0 1 2" times on those GPUs only (the others left to other work of the same call).
# BENCH_RUNS_DIR=$OUT/runs keeps the rows under $OUT as they are measured, so that a call cut off
# by the device's time limit still brings back what it measured (a file per set and GPU, plus the
# merged one per set: the device tool brings back at most 8 files; the logs stay in .bench-runs).
#
#   bash scripts/gpu_bench_sets.sh bench/cases bench/held_out ...   [extra bench/kernels.py arguments after --]
set -uo pipefail
source scripts/gpu_env.sh || exit 1
out="${OUT:-/tmp}"
runs=${BENCH_RUNS_DIR:-.bench-runs}
logs=.bench-runs
[ "${BENCH_RESUME:-0}" = 1 ] || rm -rf "$runs" "$logs"
mkdir -p "$runs" "$logs"
sets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do sets+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the rest goes to bench/kernels.py
read -ra gpu_ids <<<"${BENCH_GPUS:-$(seq -s ' ' 0 $(( $(nvidia-smi --list-gpus | wc -l) - 1 )))}"
gpus=${#gpu_ids[@]}
deadline=$(( $(date +%s) + ${BENCH_DEADLINE_S:-540} ))
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader || true
echo "sets: ${sets[*]}; $gpus GPUs"

for ((shard = 0; shard < gpus; shard++)); do
    gpu=${gpu_ids[$shard]}
    (
        for set in "${sets[@]}"; do
            name=$(basename "$set")
            left=$(( deadline - $(date +%s) ))
            [ "$left" -gt 0 ] || break
            CUDA_VISIBLE_DEVICES=$gpu timeout --signal=INT "$left" \
                python3 bench/kernels.py --set models --case-dir "$set" --min-bytes 1048576 \
                --jsonl "$runs/$name.$gpu.jsonl" --resume --shard "$shard/$gpus" "$@" >"$logs/$name.$gpu.log" 2>&1
        done
    ) &
done
wait

for set in "${sets[@]}"; do
    name=$(basename "$set")
    cat "$runs/$name".*.jsonl >"$out/$name.jsonl" 2>/dev/null
    echo "== $name: $(wc -l <"$out/$name.jsonl") rows"
    python3 bench/kernels.py --report "$out/$name.jsonl" | tail -3
done
