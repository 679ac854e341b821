#!/usr/bin/env bash
# The programs some tests need beyond Python: tmux (the live trace in a real terminal), Chromium and its driver
# (the HTML pages in a headless browser) and a C compiler (the C kernels, built at first use). Without them those
# tests skip. By default this names each missing one and how to install it; with --install it installs them with
# apt-get where it can (CI does, through .ci/run).
set -uo pipefail
install=0
[ "${1:-}" = "--install" ] && install=1

# program to look for | Debian packages | the tests that skip without it
TOOLS=(
    "tmux|tmux|the live trace in a real terminal"
    "chromedriver|chromium chromium-driver|the HTML replay and dashboard pages in headless Chromium"
    "cc|gcc libgomp1|the C kernels (GEMM, decode step, attention)"
)
missing=()
for tool in "${TOOLS[@]}"; do
    IFS="|" read -r program packages tests <<<"$tool"
    command -v "$program" >/dev/null 2>&1 && continue
    if [ "$install" = 1 ] && command -v apt-get >/dev/null 2>&1; then
        (timeout 300 apt-get update -qq && timeout 600 apt-get install -y -qq $packages) >/dev/null 2>&1
        command -v "$program" >/dev/null 2>&1 && continue
    fi
    echo "minisgl tests: no $program, so the tests of $tests will skip (apt-get install $packages)" >&2
    missing+=("$packages")
done
if [ "${#missing[@]}" -gt 0 ] && [ "$install" = 0 ]; then
    echo "minisgl tests: bash scripts/test_tools.sh --install installs them all (apt-get, as root)" >&2
fi
exit 0
