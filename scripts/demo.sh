#!/usr/bin/env bash
# Set up (if needed) and watch continuous batching on the embedded model: six requests arrive over the first
# steps, at most two run at once, so newcomers queue, say why they wait, and join the running batch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/minisgl trace sample_prompts/lesson.jsonl --max-running 2 --step-delay 0.6 "$@"
