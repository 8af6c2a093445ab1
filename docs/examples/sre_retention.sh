#!/usr/bin/env bash
# The SRE's retention controls (admin bearer token): see what each tenant's controller
# chose and why, pin lambda during an incident, unpin, and re-choose now.
set -euo pipefail
SIDECAR=${TENURE_URL:-http://127.0.0.1:8080}
H="Authorization: Bearer $TENURE_ADMIN_TOKEN"

curl -sf -H "$H" "$SIDECAR/admin/retention"                            # branch, lambda, t2
echo
curl -sf -H "$H" "$SIDECAR/admin/retention/decisions?tenant=default"   # why it chose
echo
curl -sf -H "$H" -X PATCH "$SIDECAR/admin/config" -H 'Content-Type: application/json' \
  -d '{"lambda_mode": "fixed", "lambda_fixed_per_s": 0.4}'             # pin lambda
echo
curl -sf -H "$H" -X PATCH "$SIDECAR/admin/config" -H 'Content-Type: application/json' \
  -d '{"lambda_mode": "auto"}'                                         # unpin
echo
curl -sf -H "$H" -X PATCH "$SIDECAR/admin/config" -H 'Content-Type: application/json' \
  -d '{"host_slots": 425, "w_ref_s": 1800}'                            # capacity: C2, W_ref
echo
curl -sf -H "$H" -X POST "$SIDECAR/admin/retention/decide?tenant=default"  # re-choose now
echo
curl -sf -H "$H" "$SIDECAR/admin/engines"                              # per-engine residency
echo
