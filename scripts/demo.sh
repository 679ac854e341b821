#!/usr/bin/env bash
# Set up (if needed) and watch continuous batching on the embedded model: six requests arrive over the first
# steps, at most two run at once and the KV pool holds 18 pages (tokens), so newcomers queue for a row or for KV
# pages, say why they wait, and join the running batch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/minisgl trace sample_prompts/lesson.jsonl --max-running 2 --num-pages 18 --step-delay 0.6 "$@"
