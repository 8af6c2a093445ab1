#!/usr/bin/env bash
# Claude Code through Tenure: point it at the sidecar's root URL (no /v1: Claude Code adds it).
# It then sends every model call through Tenure, its own streaming and retries unchanged.
set -euo pipefail
export ANTHROPIC_BASE_URL=${TENURE_URL:-http://127.0.0.1:8080}   # tenure serve
export ANTHROPIC_API_KEY=${TENURE_API_KEY:-sk-local}  # a key from TENURE_TENANTS: the tenant
export ANTHROPIC_MODEL=${MODEL:-Qwen/Qwen3-8B}        # the model vLLM serves
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1     # no telemetry / update checks
if [ "${1:-}" != "--check" ]; then
  exec claude "$@"    # e.g. claude -p "fix the failing test", or claude for the TUI
fi
# --check: one request shaped as Claude Code sends it, to see the sidecar take its session.
curl -sf "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" \
  -H 'anthropic-version: 2023-06-01' -H 'Content-Type: application/json' \
  -d "{\"model\": \"$ANTHROPIC_MODEL\", \"max_tokens\": 64,
       \"metadata\": {\"user_id\": \"user_abc_account_def_session_0b7e6d36-4a57-4bbf-9d57-9a1c2f1de9a1\"},
       \"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}"
echo
