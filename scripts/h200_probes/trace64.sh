#!/usr/bin/env bash
# minisgl serve alone at the given rates with a step trace and py-spy on its processes; the ITL probe on the trace.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RATES=${RATES:-64} PEER=0 OFFLINE=0 PROFILE=1 MINISGL_SERVE_ARGS="--trace-out $OUT/trace.jsonl ${EXTRA:-}" \
  bash .peer/serving/run_serve.sh 2>&1 | tail -6
python3 .peer/itl.py "$OUT/trace.jsonl" 2>&1 | tail -20
gzip -f "$OUT/trace.jsonl"; ls -la "$OUT" | head -30; cat "$OUT"/pyspy_*.log | tail -5
