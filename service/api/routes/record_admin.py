"""Admin REST of the traffic recording (bearer token, as every ``/admin`` route).

``GET /admin/record``: on or off, turns and bytes kept, the bound, turns dropped past it.
``PUT /admin/record`` ``{"enabled": true}``: switch recording on this replica (the recording
itself is shared in Redis). ``GET /admin/record/export``: the recording in the canonical trace
format (JSON Lines, ``service/replay/FORMAT.md``). ``DELETE /admin/record``: forget it.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict
from redis.exceptions import RedisError

from tenure.service.api.routes.deps import (
    ApiError,
    Services,
    error_responses,
    get_services,
    require_admin,
)
from tenure.service.api.turns.recorder import Recorder
from tenure.service.record.canonical import to_canonical

__all__ = ["router"]

router = APIRouter(
    prefix="/admin/record",
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses=error_responses(400, 401, 413, 422, 503),
)
Svc = Annotated[Services, Depends(get_services)]


class RecordSwitch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool


class RecordStatusView(BaseModel):
    enabled: bool
    turns: int
    bytes: int
    max_bytes: int
    dropped: int
    chunk_bytes: int


def _recorder(svc: Services) -> Recorder:
    if svc.recorder is None:  # pragma: no cover - every app built by create_app has one
        raise ApiError(503, "recording is not available", code="recording_unavailable")
    return svc.recorder


def _unavailable() -> ApiError:
    return ApiError(
        503, "the recording's store (Redis) is unavailable", code="state_unavailable",
        headers={"Retry-After": "1"},
    )  # fmt: skip


async def _status(recorder: Recorder) -> RecordStatusView:
    try:
        status = await recorder.status()
    except (RedisError, OSError):
        raise _unavailable() from None
    return RecordStatusView(
        enabled=status.enabled, turns=status.turns, bytes=status.bytes,
        max_bytes=status.max_bytes, dropped=status.dropped, chunk_bytes=status.chunk_bytes,
    )  # fmt: skip


@router.get("", response_model=RecordStatusView)
async def record_status(svc: Svc) -> RecordStatusView:
    return await _status(_recorder(svc))


@router.put("", response_model=RecordStatusView)
async def switch_recording(switch: RecordSwitch, svc: Svc) -> RecordStatusView:
    recorder = _recorder(svc)
    recorder.enabled = switch.enabled
    return await _status(recorder)


@router.delete("", response_model=RecordStatusView)
async def clear_recording(svc: Svc) -> RecordStatusView:
    recorder = _recorder(svc)
    try:
        await recorder.clear()
    except (RedisError, OSError):
        raise _unavailable() from None
    return await _status(recorder)


@router.get(
    "/export",
    response_class=Response,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "the trace"}},
)
async def export_recording(
    svc: Svc, block_tokens: Annotated[int, Query(ge=1, le=4096)] = 16
) -> Response:
    """The recording as a ``tenure-sessions`` trace of ``block_tokens``-token blocks."""
    recorder = _recorder(svc)
    try:
        events = [e async for e in recorder.events()]
    except (RedisError, OSError):
        raise _unavailable() from None
    lines, _summary = to_canonical(events, block_tokens=block_tokens)
    body = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
    return Response(body, media_type="application/x-ndjson")
