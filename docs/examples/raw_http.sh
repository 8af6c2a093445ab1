#!/usr/bin/env bash
# Raw HTTP: any client that can set headers. The sidecar answers as the engine would.
set -euo pipefail
SIDECAR=${TENURE_URL:-http://127.0.0.1:8080}
MODEL=${MODEL:-Qwen/Qwen3-8B}
KEY=${TENURE_API_KEY:-sk-local}

# A turn of session "sh-1"; a ~5 s tool call follows it.
curl -sf "$SIDECAR/v1/chat/completions" -H "Authorization: Bearer $KEY" \
  -H 'Content-Type: application/json' \
  -H 'X-Tenure-Session: sh-1' -H 'X-Tenure-Expected-Gap-Ms: 5000' \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"ls\"}]}"
echo

# The same hints as a `tenure` object in the body instead of headers.
curl -sf "$SIDECAR/v1/chat/completions" -H "Authorization: Bearer $KEY" \
  -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"ls\"}],
       \"tenure\": {\"session\": \"sh-1\", \"expected_gap_s\": 5}}"
echo

# Suspend for a human approval (the sidecar answers with the host TTL it chose), resume, end.
curl -sf -X POST "$SIDECAR/v1/sessions/sh-1/suspend" -H "Authorization: Bearer $KEY" \
  -H 'Content-Type: application/json' -d '{"reason": "approval", "expected_wait_s": 600}'
echo
curl -sf -X POST "$SIDECAR/v1/sessions/sh-1/resume" -H "Authorization: Bearer $KEY"
echo
curl -sf -X POST "$SIDECAR/v1/sessions/sh-1/end" -H "Authorization: Bearer $KEY"
echo
curl -sf "$SIDECAR/v1/sessions/sh-1" -H "Authorization: Bearer $KEY"
echo
