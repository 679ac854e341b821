#!/usr/bin/env bash
# Set up (if needed) and watch the scheduler run the chapter's five prompts on the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/minisgl trace "$@"
