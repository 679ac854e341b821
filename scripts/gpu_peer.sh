#!/usr/bin/env bash
# The peer table in one device call, from the repository root of a CUDA machine (carry .whl, .peer and, when
# an earlier call saved one, .jitcache; ../shared/peers/prepare.sh makes .peer):
#   bash scripts/gpu_peer.sh                       # minisgl bf16, minisgl fp8, mini-sglang, then the ratios
#   STAGES="tests fp8" bash scripts/gpu_peer.sh
# Stages, in the order given: tests (the fp8 decode and gather GPU tests), bf16 and fp8 (.peer/peer_bench.py minisgl, pages of $PAGE tokens, default
# 128, the KV cache in bf16 or fp8), ab, ab2, ab<anything> (bf16 with the variables in $AB_ENV, $AB2_ENV, ...
# exported, e.g. AB_ENV="MINISGL_SPLIT_K=0" for the A/B of the default split, and/or the LLM options in $AB_KW, default
# '{"page_size": $PAGE}'; a stage needs at least one of the two),
# peer (mini-sglang on the same workload), quality (greedy tokens of fp8 KV against bf16 KV on
# the workload's first 64 prompts, scripts/gpu_fp8_quality.py). Each stage has a time limit (T_<stage>, seconds) and
# writes its log to $OUT/<stage>.log; the compiled kernels are saved to $OUT/jit.tar.gz.* after each engine
# stage, so a call cut short still leaves the next one warm.
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:-$PWD/out/gpu}
mkdir -p "$OUT"
. scripts/gpu_env.sh
STAGES=${STAGES:-bf16 fp8 peer}
# pages of 128 tokens: flashinfer's decode reads a head-major pool's large pages faster (docs/BENCHMARKS.md,
# "GPU fast paths"; mini-sglang's own bench runs pages of 256)
PAGE=${PAGE:-128}

run_stage() {  # name, then the command; its limit from T_<name>
    local name=$1 limit_var="T_$1" t0=$(date +%s)
    shift
    timeout "${!limit_var:-300}" "$@" > "$OUT/$name.log" 2>&1
    echo "gpu_peer: $name rc=$? $(( $(date +%s) - t0 ))s (at $(( $(date +%s) - START ))s)" >&2
    grep -v Capturing "$OUT/$name.log" | tail -n "${TAIL:-4}" >&2
}

for stage in $STAGES; do
    case $stage in
        tests) run_stage tests python3 -m pytest -q -x tests/gpu/test_fp8_decode_cuda.py tests/gpu/test_fp8_gather.py ;;
        bf16) MINISGL_KW="{\"page_size\": $PAGE}" run_stage bf16 python3 .peer/peer_bench.py minisgl "$OUT/bf16.json"
            save_compiled_kernels ;;
        ab*) vars=${stage^^}_ENV kw=${stage^^}_KW
            [ -n "${!vars:-}${!kw:-}" ] || { echo "gpu_peer: stage $stage needs $vars or $kw" >&2; exit 2; }
            (if [ -n "${!vars:-}" ]; then export ${!vars}; fi
             MINISGL_KW=${!kw:-"{\"page_size\": $PAGE}"} run_stage "$stage" python3 .peer/peer_bench.py minisgl \
                 "$OUT/$stage.json") ;;
        fp8) MINISGL_KW="{\"page_size\": $PAGE, \"kv_dtype\": \"fp8\"}" run_stage fp8 \
            python3 .peer/peer_bench.py minisgl "$OUT/fp8.json"
            save_compiled_kernels ;;
        peer) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer .peer/whl/*.whl
            PYTHONPATH=/tmp/peer:/tmp/site:$PWD/.peer/mini-sglang/python run_stage peer \
                python3 .peer/peer_bench.py minisglang "$OUT/peer.json" "$PWD/.peer/qwen3-cfg"
            save_compiled_kernels ;;
        quality) run_stage quality python3 scripts/gpu_fp8_quality.py --requests 64 --max-tokens 256 \
            --json "$OUT/quality.json" ;;
        *) echo "gpu_peer: unknown stage $stage (tests, bf16, ab*, fp8, peer, quality)" >&2; exit 2 ;;
    esac
done

python3 - "$OUT" <<'EOF'
import json, os, sys
runs = {}
for name in ["bf16"] + sorted(f[:-5] for f in os.listdir(sys.argv[1]) if f.startswith("ab") and
                                        f.endswith(".json")) + ["fp8", "peer"]:
    path = os.path.join(sys.argv[1], f"{name}.json")
    if os.path.exists(path):
        runs[name] = json.load(open(path))
for name, run in runs.items():
    print(f"{name}: {run['tok_s']:.0f} tok/s, batch-1 decode {run['batch1_ms']:.3f} ms")
peer = runs.get("peer")
for name in runs:
    if peer and name != "peer":
        print(f"minisgl {name} / mini-sglang: throughput {runs[name]['tok_s'] / peer['tok_s']:.2f}x, "
              f"batch-1 {peer['batch1_ms'] / runs[name]['batch1_ms']:.2f}x faster")
EOF
echo "gpu_peer: $(( $(date +%s) - START ))s in all" >&2
