#!/usr/bin/env bash
# Screenshot a generated fp8lab report.html in headless Chromium, to check that every figure renders.
#
#   benchmarks/report_screenshot.sh REPORT_HTML [OUT_PNG] [WIDTH] [HEIGHT]
#
#   REPORT_HTML  report.html written by `fp8lab report` / `python -m analysis` (self-contained),
#                or an http(s):// URL (e.g. the runs view `fp8lab ui` prints)
#   OUT_PNG      screenshot path (default: next to the report, report.png)
#   WIDTH HEIGHT window size in CSS pixels (default 1280 x 12000: tall enough for the whole page of a
#                typical sweep; the page is not scrolled, so raise HEIGHT for long reports)
#
# Needs Chromium: `apt-get install chromium` (Debian) or set CHROMIUM=/path/to/chrome.
# VIRTUAL_TIME_MS (default 5000): how long the page may load and run scripts (raise it for live pages).
# Exit status: 0 with the PNG written, 2 when no Chromium is found, else Chromium's failure.
set -euo pipefail

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [[ "$1" =~ ^https?:// ]]; then
  page="$1"
  out="${2:-report.png}"
else
  html="$(realpath "$1")"
  page="file://${html}"
  out="${2:-$(dirname "$html")/report.png}"
fi
width="${3:-1280}"
height="${4:-12000}"

browser="${CHROMIUM:-}"
if [[ -z "$browser" ]]; then
  for candidate in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$candidate" >/dev/null 2>&1; then browser="$(command -v "$candidate")"; break; fi
  done
fi
if [[ -z "$browser" ]]; then
  echo "no Chromium found: apt-get install chromium, or set CHROMIUM=/path/to/chrome" >&2
  exit 2
fi

mkdir -p "$(dirname "$out")"
out="$(realpath "$out")"
# --no-sandbox: Chromium refuses to run as root with its sandbox (containers, CI).
# A throwaway profile keeps the run independent of any user profile.
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
  --user-data-dir="$profile" --virtual-time-budget="${VIRTUAL_TIME_MS:-5000}" \
  --window-size="${width},${height}" --screenshot="$out" "$page" >/dev/null 2>&1
if [[ ! -s "$out" ]]; then
  echo "Chromium wrote no screenshot to $out" >&2
  exit 1
fi
echo "$out"
