#!/usr/bin/env bash
# The whole GPU check in one command, from the repository root of a CUDA machine:
#   bash scripts/gpu_check.sh
# 1. installs flashinfer from the wheels in .whl/ (if present) into /tmp/site;
# 2. restores compiled kernels saved by an earlier run (.jitcache/jit.tar.gz*), which saves minutes of builds;
# 3. runs scripts/gpu_check.py: kernel builds, GPU tests, correctness on the real shape, benchmarks;
# 4. saves the compiled kernels to $OUT/jit.tar.gz* for the next run.
# Logs and figures go to $OUT (default out/gpu). Budget: MINISGL_CHECK_BUDGET seconds (default 510).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:-$PWD/out/gpu}
mkdir -p "$OUT"
. scripts/gpu_env.sh

BUDGET=${MINISGL_CHECK_BUDGET:-510}
LEFT=$((BUDGET - ($(date +%s) - START)))
python3 scripts/gpu_check.py --out "$OUT" --budget "$LEFT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
STATUS=${PIPESTATUS[0]}
LEFT=$((BUDGET - ($(date +%s) - START)))
if [ "$STATUS" -gt 128 ] && [ "$LEFT" -gt 90 ]; then
    # the process died (a CUDA fault aborts it): measure again with the plain loop, so the run still gives figures
    echo "gpu_check: the check died (exit $STATUS); again with overlap scheduling off, ${LEFT}s left" >&2
    mkdir -p "$OUT/plain"
    MINISGL_DISABLE_OVERLAP_SCHEDULING=1 python3 scripts/gpu_check.py --out "$OUT/plain" --budget "$LEFT" \
        --skip-pytest "$@" 2>&1 | tee "$OUT/plain/gpu_check.log"
fi

# save compiled kernels for the next run
save_compiled_kernels
echo "gpu_check: $(( $(date +%s) - START ))s in all, exit $STATUS"
exit "$STATUS"
