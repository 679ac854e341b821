#!/usr/bin/env bash
# GPU tests of the Triton decode kernels, then step costs of both engines (.peer/step_probe.py).
set -u
. scripts/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .peer/srvwhl/*.whl 2>&1 | grep -v "already exists"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer .peer/whl/*.whl 2>&1 | grep -v "already exists"
if [ "${TESTS:-1}" = 1 ]; then
  T=$(date +%s)
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_paged_decode.py tests/gpu/test_fp8_decode_cuda.py \
    tests/kernels/test_paged_decode_rows.py tests/kernels/test_small_decode.py 2>&1 | tail -3
  echo "tests took $(( $(date +%s) - T ))s"
fi
T=$(date +%s)
timeout 200 python3 .peer/step_probe.py minisgl 2>&1 | tail -2
echo "minisgl probe took $(( $(date +%s) - T ))s"
T=$(date +%s)
PYTHONPATH=/tmp/peer:/tmp/site:$PWD/.peer/mini-sglang/python timeout 200 python3 .peer/step_probe.py peer .peer/qwen3-cfg 2>&1 | tail -2
echo "peer probe took $(( $(date +%s) - T ))s"
