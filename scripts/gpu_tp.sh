#!/usr/bin/env bash
# Tensor parallelism on a machine with two GPUs, in one command from the repository root:
#   bash scripts/gpu_tp.sh
# tp=2 over NCCL against tp=1 (token agreement, a killed worker), then tp=1 vs tp=2 throughput.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/gpu}
mkdir -p "$OUT"
. scripts/gpu_env.sh
python3 scripts/gpu_tp_check.py --kill-test --json "$OUT/tp_check.json" 2>&1 | tee "$OUT/tp_check.log"
CHECK=${PIPESTATUS[0]}
python3 scripts/gpu_tp_bench.py "$@" 2>&1 | tee "$OUT/tp_bench.log"
BENCH=${PIPESTATUS[0]}
echo "gpu_tp: check exit $CHECK, bench exit $BENCH"
[ "$CHECK" -eq 0 ] && [ "$BENCH" -eq 0 ]
