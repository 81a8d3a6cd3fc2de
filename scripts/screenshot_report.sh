#!/usr/bin/env bash
# Screenshot of the HTML report of `tritonpatch compare`, as a browser shows it.
#
# Makes the report for examples/masked_attention.toml (A: plain Triton, B: disable-lsr; compile-only,
# so no GPU is needed) and screenshots it with headless Chromium. The result is docs/compare_report.png
# unless another path is given.
#
#   scripts/screenshot_report.sh [OUT.png]
#
# Needs tritonpatch installed (`pip install -e .`) and Chromium: `apt-get install chromium` (or
# chromium-headless-shell); set CHROMIUM to use another binary. WIDTH and HEIGHT set the window
# size in CSS pixels (default 1200 x 2760, enough for the whole page; the diffs scroll inside it).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/docs/compare_report.png}
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-headless-shell || command -v chromium-browser || true)}
if [ -z "$chromium" ]; then
    echo "screenshot_report.sh: no chromium found; install it (apt-get install chromium) or set CHROMIUM" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Run from a scratch folder holding a link to examples/, so the report's header shows the command
# as a user types it in a checkout.
ln -s "$root/examples" "$work/examples"
if ! (cd "$work" && python -m tritonpatch compare examples/masked_attention.toml --b disable-lsr \
        --html report.html >compare.out 2>compare.err); then
    cat "$work/compare.err" >&2
    exit 1
fi
# --no-sandbox: Chromium refuses to start its sandbox as root (containers, CI).
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
    --window-size="${WIDTH:-1200},${HEIGHT:-2760}" --screenshot="$work/report.png" "file://$work/report.html" \
    2>"$work/chromium.err" || { cat "$work/chromium.err" >&2; exit 1; }
cp "$work/report.png" "$out"
echo "wrote $out"
