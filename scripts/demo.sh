#!/usr/bin/env bash
# Set up (if needed) and watch continuous batching on the embedded model: six requests arrive over the first
# steps, at most two run at once and the KV pool holds 18 pages (tokens), so newcomers queue for a row or for KV
# pages, say why they wait, and join the running batch. Then admission by estimate: three requests admitted on
# what they are expected to need outgrow a pool of 35 pages, and the newest is preempted and recomputed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/minisgl trace sample_prompts/lesson.jsonl --max-running 2 --num-pages 18 --admission reserve --step-delay 0.6 "$@"
exec .venv/bin/minisgl trace sample_prompts/preemption.jsonl --max-running 3 --num-pages 35 --step-delay 0.6 "$@"
