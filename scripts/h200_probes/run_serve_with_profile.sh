#!/usr/bin/env bash
# On the H200, from the project's root, after ../shared/peers/prepare.sh (carry .whl and .peer):
#   bash .peer/serving/run_serve.sh            # RATES="inf 16 32 64" by default; PEER=0 skips mini-sglang
# minisgl offline (.peer/peer_bench.py), then `minisgl serve` and mini-sglang's server, each driven by the same
# client (.peer/serving/serve_bench.py, 4 client processes) on nano-vllm's workload, all at once (rate inf) and
# at Poisson rates. A table last; JSON and server logs in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. scripts/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .peer/srvwhl/*.whl 2>&1 | grep -v "already exists"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer .peer/whl/*.whl 2>&1 | grep -v "already exists"
RATES=${RATES:-"inf 16 32 64"}
wait_up() { for i in $(seq 300); do curl -s -o /dev/null "$1" && return 0; kill -0 "$2" 2>/dev/null || return 1; sleep 1; done; return 1; }
bench() {  # name url api
  local first=1
  for r in $RATES; do
    W=""; [ $first = 1 ] && W=--warm; first=0
    timeout 240 python3 .peer/serving/serve_bench.py "$2" "$3" "$OUT/$1_$r.json" --rate "$r" --model m $W > "$OUT/$1_$r.log" 2>&1 \
      || { echo "$1 at rate $r failed:"; tail -3 "$OUT/$1_$r.log"; }
  done
}
if [ "${OFFLINE:-1}" = 1 ]; then
  MINISGL_KW='{"page_size": 128}' timeout 240 python3 .peer/peer_bench.py minisgl "$OUT/offline.json" > "$OUT/offline.log" 2>&1 \
    || { echo "offline run failed:"; tail -5 "$OUT/offline.log"; }
fi
T=$(date +%s)
python3 -c 'import sys; from minisgl_cli.app import main; sys.argv[0] = "minisgl"; main()' serve --model random:qwen3-0.6b \
  --max-running 256 --page-size 128 --port 8100 --served-model-name m ${MINISGL_SERVE_ARGS:-} > "$OUT/minisgl_server.log" 2>&1 &
P=$!
if wait_up http://127.0.0.1:8100/health $P; then
  echo "minisgl serve up after $(( $(date +%s) - T ))s"
  if [ "${PROFILE:-0}" = 1 ]; then  # py-spy on the engine process (the server's child) while the rates run
    python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .peer/pyspy/*.whl 2>&1 | grep -v "already exists"
    for c in $(pgrep -P $P); do
      /tmp/pyspy/bin/py-spy record --pid $c --nonblocking -r 500 -f raw -o "$OUT/prof_$c.txt" --duration ${PROFILE_S:-25} \
        > "$OUT/pyspy_$c.log" 2>&1 &
    done
    /tmp/pyspy/bin/py-spy record --pid $P --nonblocking -r 500 -f raw -o "$OUT/prof_api.txt" --duration ${PROFILE_S:-25} \
      > "$OUT/pyspy_api.log" 2>&1 &
  fi
  bench minisgl http://127.0.0.1:8100 ids
  kill -INT $P; wait $P; echo "minisgl serve exit $?"
else
  echo "minisgl serve did not start:"; tail -20 "$OUT/minisgl_server.log"
fi
if [ "${PEER:-1}" = 1 ]; then
  T=$(date +%s)
  PYTHONPATH=/tmp/peer:/tmp/site:$PWD/.peer/mini-sglang/python python3 -m minisgl --model-path .peer/qwen3-cfg --dummy-weight \
    --max-running-requests 256 --max-seq-len-override 4096 --max-prefill-length 16384 --cuda-graph-max-bs 256 \
    --page-size 256 --attn fi --port 8200 > "$OUT/peer_server.log" 2>&1 &
  Q=$!
  if wait_up http://127.0.0.1:8200/v1/models $Q; then
    echo "mini-sglang server up after $(( $(date +%s) - T ))s"; bench peer http://127.0.0.1:8200 words
  else
    echo "mini-sglang did not start:"; tail -20 "$OUT/peer_server.log"
  fi
  kill -INT $Q 2>/dev/null; sleep 3; kill $Q 2>/dev/null; pkill -P $Q 2>/dev/null
fi
python3 - "$OUT" <<'P'
import json, os, sys
out = sys.argv[1]
off = json.load(open(os.path.join(out, "offline.json")))["tok_s"] if os.path.exists(os.path.join(out, "offline.json")) else None
print(f"{'run':>12} {'tok/s':>9} {'of offline':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT':>7} {'ITL p99':>8} errors")
for f in sorted(os.listdir(out)):
    if f.endswith(".json") and f != "offline.json":
        d = json.load(open(os.path.join(out, f)))
        frac = f"{d['output_tok_s'] / off:.0%}" if off else "-"
        print(f"{f[:-5]:>12} {d['output_tok_s']:>9.0f} {frac:>10} {d['ttft_ms_p50']:>9} {d['ttft_ms_p99']:>9} {d['tpot_ms_mean']:>7} {d['itl_ms_p99']:>8} {d['errors']}")
if off: print(f"offline minisgl {off:.0f} tok/s")
P
