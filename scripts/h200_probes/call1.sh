#!/usr/bin/env bash
# GPU tests of the Triton decode kernels, then minisgl serve with mixed steps off and on at 32 and 64 req/s.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=$(date +%s)
( . scripts/gpu_env.sh; timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_paged_decode.py \
    tests/gpu/test_fp8_decode_cuda.py tests/kernels/test_paged_decode_rows.py tests/kernels/test_small_decode.py 2>&1 | tail -2 )
echo "tests took $(( $(date +%s) - T ))s"
for arm in ${ARMS:-off on}; do
  ARGS=""; [ $arm = off ] && ARGS="--no-mixed-steps"
  T=$(date +%s)
  OUT=$OUT/$arm RATES=${RATES:-"32 64"} PEER=0 OFFLINE=0 MINISGL_SERVE_ARGS="$ARGS" bash .peer/serving/run_serve.sh 2>&1 \
    | grep -v "serve up\|serve exit\|offline minisgl" | sed "s/^/$arm: /"
  echo "$arm took $(( $(date +%s) - T ))s"
done
