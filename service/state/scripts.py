"""Lua scripts: every read-modify-write of session state is one atomic script call.

Two scripts cover all writes:

* :data:`TURN_START` runs on the proxy's hot path (one round trip per proxied request): it
  resolves the session (explicit id, or inferred from message-prefix hashes), counts the turn,
  records the gap (or suspension wait) that just ended, and publishes the session's "active"
  decision (when the adapter needs it) with the next sequence number.
* :data:`APPLY` is a guarded update used by everything else (turn end, end / suspend / resume,
  sub-agent spawn): it checks a guard field (the record's ``version`` for read-modify-write
  callers, the ``turn`` for the end of a turn), writes the fields, moves the session in the
  live index, sets its expiry and publishes a decision, or changes nothing.

Decisions are JSON objects built by the caller (from the decision core); the script fills in
``seq`` (and ``turn`` on the hot path), appends to the bounded stream, updates the decision table
that push snapshots are made from, and garbage-collects table entries of expired sessions.

Arguments travel as one JSON array of strings (``A`` below, decoded once in the script) rather
than as a dozen separate ``ARGV`` values: client-side encoding of each command argument was the
largest single cost of the proxy's Redis round trip.

Keys are passed in ``KEYS`` (built by :mod:`service.state.keys`); the one exception is the
session key on the hot path when the session is inferred, which the script completes from a
key prefix the caller built, because the id is only known inside the script.
"""

from __future__ import annotations

__all__ = ["APPLY", "TURN_START"]

# Shared tail: publish one decision. Expects: now, seq-less decision table `d`, scoped id `sid`,
# KEYS dseq/decisions/dtable/dgc at the indexes passed, stream maxlen, and gc deadline.
_PUBLISH = """
local function publish(d, scoped, k_seq, k_stream, k_table, k_gc, maxlen, gc_at, now)
  local seq = redis.call('INCR', k_seq)
  d['seq'] = seq
  local body = cjson.encode(d)
  redis.call('XADD', k_stream, 'MAXLEN', '~', maxlen, '*', 'seq', seq, 'd', body)
  redis.call('HSET', k_table, scoped, body)
  redis.call('ZADD', k_gc, gc_at, scoped)
  local dead = redis.call('ZRANGEBYSCORE', k_gc, '-inf', now, 'LIMIT', 0, 64)
  if #dead > 0 then
    redis.call('HDEL', k_table, unpack(dead))
    redis.call('ZREM', k_gc, unpack(dead))
  end
  return seq
end
"""

#: KEYS: 1 live index, 2 dseq, 3 decisions stream, 4 decision table, 5 table gc, 6 gap
#:       observations, 7 waits, 8.. prefix-hash keys (own full hash first, then shorter
#:       prefixes newest first; empty list when the session is explicit)
#: A (ARGV[1], a JSON array of strings; ARGV[2] is the decision JSON): 1 now, 2 explicit
#:       session id or '', 3 session key prefix, 4 id for a new inferred
#:       session, 5 scoped-id prefix ("tenant/"), 6 segment or '', 7 parent or '',
#:       8 last_turn '1'/'0', 9 session ttl s, 10 stream maxlen, 11 list maxlen,
#:       12 decision JSON (seq/turn/session filled here)
#: Returns: {session id, turn, previous state, gap observation entry or '', seq, inferred 0/1}
#: (an observation entry is 'stop_reason|tool|gap_s|expected_s', as in the gap log)
TURN_START = (
    _PUBLISH
    + """
local A = cjson.decode(ARGV[1])
A[12] = ARGV[2]
local now = tonumber(A[1])
local sid = A[2]
local inferred = 0
if sid == '' then
  inferred = 1
  for i = 8, #KEYS do
    local found = redis.call('GET', KEYS[i])
    if found then sid = found; break end
  end
  if sid == '' then sid = A[4] end
end
local skey = A[3] .. sid
local ttl = tonumber(A[9])
local listmax = tonumber(A[11]) - 1
local prev = redis.call('HMGET', skey, 'state', 'turn', 'last_end', 'stop_reason', 'tool',
                        'expected_gap_s', 'suspended_at', 'parent', 'created_at', 'segments')
local prev_state = prev[1] or ''
local turn = tonumber(prev[2] or '0') + 1
local observed = ''
if prev_state == 'idle' and prev[3] then
  local gap = now - tonumber(prev[3])
  if gap < 0 then gap = 0 end
  observed = (prev[4] or '') .. '|' .. (prev[5] or '') .. '|' .. string.format('%.6f', gap)
             .. '|' .. (prev[6] or '')
  redis.call('LPUSH', KEYS[6], observed)
  redis.call('LTRIM', KEYS[6], 0, listmax)
elseif prev_state == 'suspended' and prev[7] then
  local wait = now - tonumber(prev[7])
  if wait < 0 then wait = 0 end
  redis.call('LPUSH', KEYS[7], string.format('%.6f', wait))
  redis.call('LTRIM', KEYS[7], 0, listmax)
end
local fields = {'state', 'active', 'turn', turn, 'last_activity', A[1],
                'last_turn', A[8], 'id', sid}
if not prev[9] then
  table.insert(fields, 'created_at'); table.insert(fields, A[1])
  table.insert(fields, 'inferred'); table.insert(fields, tostring(inferred))
end
local parent = prev[8]
if A[7] ~= '' and not parent then
  parent = A[7]
  table.insert(fields, 'parent'); table.insert(fields, parent)
end
if A[6] ~= '' then
  local segs = {}
  if prev[10] then segs = cjson.decode(prev[10]) end
  local seen = false
  for _, s in ipairs(segs) do if s == A[6] then seen = true end end
  if not seen and #segs < 256 then
    table.insert(segs, A[6])
    table.insert(fields, 'segments'); table.insert(fields, cjson.encode(segs))
  end
end
redis.call('HSET', skey, unpack(fields))
redis.call('HINCRBY', skey, 'version', 1)
redis.call('HDEL', skey, 'suspended_at', 'wakeup_at', 'host_ttl_s')
redis.call('EXPIRE', skey, ttl)
redis.call('ZADD', KEYS[1], now, sid)
if inferred == 1 and #KEYS >= 8 then
  redis.call('SET', KEYS[8], sid, 'EX', ttl)
end
-- The engine sees an arriving request itself, so "active" only needs publishing when it
-- changes what the adapter holds: a new session, one leaving suspension (its host TTL timer)
-- or finish, or a declared last turn.
local seq = 0
if prev_state ~= 'idle' and prev_state ~= 'active' or A[8] == '1' then
  local d = cjson.decode(A[12])
  d['session_id'] = A[5] .. sid
  d['turn'] = turn
  if parent then d['parent'] = A[5] .. parent end
  seq = publish(d, A[5] .. sid, KEYS[2], KEYS[3], KEYS[4], KEYS[5],
                tonumber(A[10]), now + ttl, now)
end
return {sid, turn, prev_state, observed, seq, inferred}
"""
)

#: KEYS: 1 session, 2 live index, 3 dseq, 4 decisions stream, 5 decision table, 6 table gc,
#:       7 a bounded list to push to (waits / suspensions) or the session key again if none
#: A (ARGV[1], a JSON array of strings): 1 now, 2 guard field ('' none), 3 guard value
#:       ('' = the record must not exist),
#:       4 fields JSON object, 5 deleted fields JSON list, 6 live score ('' = remove,
#:       '=' = keep),
#:       7 ttl s, 8 scoped id, 9 decision JSON or '', 10 stream maxlen, 11 session id,
#:       12 value to push to KEYS[7] or '', 13 list maxlen, 14 must exist '1'/'0'
#: Returns: {status, seq} with status 1 applied, 0 guard failed, -1 missing, -2 exists
APPLY = (
    _PUBLISH
    + """
local A = cjson.decode(ARGV[1])
local now = tonumber(A[1])
local exists = redis.call('EXISTS', KEYS[1]) == 1
if A[3] == '' and A[2] ~= '' then
  if exists then return {-2, 0} end
elseif A[14] == '1' and not exists then
  return {-1, 0}
end
if A[2] ~= '' and A[3] ~= '' then
  local current = redis.call('HGET', KEYS[1], A[2])
  if current ~= A[3] then return {0, 0} end
end
local fields = cjson.decode(A[4])
local flat = {}
for k, v in pairs(fields) do table.insert(flat, k); table.insert(flat, tostring(v)) end
if #flat > 0 then redis.call('HSET', KEYS[1], unpack(flat)) end
local deleted = cjson.decode(A[5])
if #deleted > 0 then redis.call('HDEL', KEYS[1], unpack(deleted)) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
local ttl = tonumber(A[7])
redis.call('EXPIRE', KEYS[1], ttl)
if A[6] == '' then
  redis.call('ZREM', KEYS[2], A[11])
elseif A[6] == '=' then
  -- unchanged position in the live index
else
  redis.call('ZADD', KEYS[2], A[6], A[11])
end
if A[12] ~= '' then
  redis.call('LPUSH', KEYS[7], A[12])
  redis.call('LTRIM', KEYS[7], 0, tonumber(A[13]) - 1)
end
local seq = 0
if A[9] ~= '' then
  seq = publish(cjson.decode(A[9]), A[8], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
                tonumber(A[10]), now + ttl, now)
end
return {1, seq}
"""
)
