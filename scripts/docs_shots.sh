#!/usr/bin/env bash
# The site as a person sees it: build it, serve it on loopback, and have Debian's headless
# Chromium render the home page and one reference page to PNG in docs/assets/shots/ (commit
# them when they change). `make docs-shots`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/assets/shots}
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ] && command -v apt-get >/dev/null 2>&1; then
    # Only this target needs a browser, so `make test` does not install one.
    echo "docs-shots: installing Debian's chromium" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
    CHROMIUM=$(command -v chromium || true)
fi
if [ -z "$CHROMIUM" ]; then
    echo "docs-shots: chromium not found (Debian: apt-get install chromium)" >&2
    exit 2
fi
WORK=$(mktemp -d /tmp/tenure-docs-shots.XXXXXX)
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
NO_MKDOCS_2_WARNING=1 PYTHONPATH=$PWD .venv/bin/mkdocs build --strict --site-dir "$WORK/site"
PORT=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
.venv/bin/python -m http.server "$PORT" --bind 127.0.0.1 --directory "$WORK/site" >/dev/null 2>&1 &
server=$!
until .venv/bin/python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/')" 2>/dev/null; do
    kill -0 "$server" || { echo "docs-shots: the HTTP server did not start" >&2; exit 1; }
    sleep 0.2
done
mkdir -p "$OUT"
shot() {  # shot PAGE FILE
    "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-background-networking \
        --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
        --user-data-dir="$WORK/profile" --window-size=1280,1600 \
        --virtual-time-budget=5000 --screenshot="$2" "http://127.0.0.1:$PORT/$1" 2>"$WORK/chromium.log" \
        || { cat "$WORK/chromium.log" >&2; exit 1; }
    [ -s "$2" ] || { echo "docs-shots: no picture for $1" >&2; exit 1; }
    echo "docs-shots: $1 -> $2"
}
shot "" "$OUT/home.png"
shot "reference/settings/" "$OUT/reference-settings.png"
