#!/usr/bin/env bash
# Claude Code through Tenure: point it at the sidecar's root URL. It speaks /v1/messages and
# names its session in metadata.user_id, which the sidecar reads; nothing else changes.
set -euo pipefail
export ANTHROPIC_BASE_URL=${TENURE_URL:-http://127.0.0.1:8080}
export ANTHROPIC_API_KEY=${TENURE_API_KEY:-sk-local}  # selects the tenant on the sidecar
if [ "${1:-}" != "--check" ]; then
  exec claude "$@"
fi
# --check: one request shaped as Claude Code sends it, to see the sidecar take its session.
curl -sf "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" \
  -H 'anthropic-version: 2023-06-01' -H 'Content-Type: application/json' \
  -d "{\"model\": \"${MODEL:-Qwen/Qwen3-8B}\", \"max_tokens\": 64,
       \"metadata\": {\"user_id\": \"user_abc_account_def_session_0b7e6d36-4a57-4bbf-9d57-9a1c2f1de9a1\"},
       \"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}"
echo
