#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on the CPU. Names the programs that some tests need and that
# are missing here (scripts/test_tools.sh); the last line counts the tests that skipped, by reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/test_tools.sh
exec .venv/bin/python -m pytest -q "$@"
