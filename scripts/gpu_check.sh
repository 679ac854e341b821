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

# save compiled kernels (flashinfer .so files in AOT layout, inductor and triton caches) for the next run
if [ -n "$FI_JIT" ]; then
    PACK=$CACHE/pack
    rm -rf "$PACK" && mkdir -p "$PACK/aot"
    for so in "$FI_JIT"/*/*.so "$FI_AOT"/*/*.so; do
        [ -f "$so" ] || continue
        name=$(basename "$(dirname "$so")")
        mkdir -p "$PACK/aot/$name" && cp "$so" "$PACK/aot/$name/"
    done
    cp -r "$CACHE/inductor" "$CACHE/triton" "$PACK/" 2>/dev/null
    tar -czf "$CACHE/jit.tar.gz" -C "$PACK" .
    if [ "$(stat -c %s "$CACHE/jit.tar.gz")" -lt $((44 << 20)) ]; then  # what a run can carry beside the wheels
        split -b 15m -d "$CACHE/jit.tar.gz" "$OUT/jit.tar.gz."
    else
        echo "gpu_check: compiled kernels ($(du -h "$CACHE/jit.tar.gz" | cut -f1)) too large to return" >&2
    fi
    echo "gpu_check: saved compiled kernels: $(du -ch "$OUT"/jit.tar.gz.* | tail -1 | cut -f1) in $(ls "$OUT"/jit.tar.gz.* | wc -l) parts" >&2
fi
echo "gpu_check: $(( $(date +%s) - START ))s in all, exit $STATUS"
exit "$STATUS"
