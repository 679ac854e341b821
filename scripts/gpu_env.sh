# Sourced by the GPU scripts: flashinfer from the carried wheels in .whl/, compiled kernels restored from
# .jitcache/, and the environment they run in. Sets CACHE, FI_AOT and FI_JIT for the caller, and defines
# save_compiled_kernels for the end of a run.
CACHE=/tmp/minisgl-cache
mkdir -p "$CACHE"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export FLASHINFER_USE_CUDA_NORM=1  # the CUDA norm kernels; the CuTe-DSL ones need packages not carried here
export TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor TRITON_CACHE_DIR=$CACHE/triton

if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        || echo "gpu_check: installing the wheels in .whl/ failed" >&2
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}

FI_AOT=$(python3 -c 'import flashinfer.jit.env as e; print(e.FLASHINFER_AOT_DIR)' 2>/dev/null)
FI_JIT=$(python3 -c 'import flashinfer.jit.env as e; print(e.FLASHINFER_JIT_DIR)' 2>/dev/null)
if ls .jitcache/jit.tar.gz* >/dev/null 2>&1 && [ -n "$FI_AOT" ]; then
    # flashinfer loads a prebuilt module from its AOT folder without running ninja
    mkdir -p "$CACHE/restore" "$FI_AOT"
    cat .jitcache/jit.tar.gz* | tar -xzf - -C "$CACHE/restore"
    cp -r "$CACHE/restore/aot/." "$FI_AOT/" 2>/dev/null
    cp -r "$CACHE/restore/inductor" "$CACHE/restore/triton" "$CACHE/" 2>/dev/null
    echo "gpu_check: restored $(ls "$FI_AOT" | wc -l) prebuilt flashinfer modules" >&2
fi

save_compiled_kernels() {
    # this machine's compiled kernels (flashinfer's .so files in AOT layout, inductor's and Triton's caches) to
    # $OUT/jit.tar.gz.* for the next call, which restores them from .jitcache/ (above)
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
            echo "gpu_env: saved compiled kernels: $(du -ch "$OUT"/jit.tar.gz.* | tail -1 | cut -f1) in $(ls "$OUT"/jit.tar.gz.* | wc -l) parts" >&2
        else
            echo "gpu_env: compiled kernels ($(du -h "$CACHE/jit.tar.gz" | cut -f1)) too large to return" >&2
        fi
    fi
}
