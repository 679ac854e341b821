#!/usr/bin/env bash
# Save the compiled kernels of this machine (flashinfer's .so files in AOT layout, inductor's and Triton's
# caches) to $OUT/jit.tar.gz.* for the next call, which restores them from .jitcache/ (scripts/gpu_env.sh).
# Sourced after scripts/gpu_env.sh, which sets CACHE, FI_AOT and FI_JIT.
if [ -n "${FI_JIT:-}" ]; then
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
        echo "gpu_save_cache: saved compiled kernels: $(du -ch "$OUT"/jit.tar.gz.* | tail -1 | cut -f1) in $(ls "$OUT"/jit.tar.gz.* | wc -l) parts" >&2
    else
        echo "gpu_save_cache: compiled kernels ($(du -h "$CACHE/jit.tar.gz" | cut -f1)) too large to return" >&2
    fi
fi
