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

The scripts avoid ``cjson`` on the per-request paths: arguments are plain ``ARGV`` strings (the
client packs them with hiredis, so many arguments cost little), field/value pairs are flat, and
a decision arrives as the JSON text before and after its ``seq`` value, joined in the script.
Measured with the two scripts pipelined on this project's VM, decoding and re-encoding JSON in
Lua was over half of APPLY's time (64 -> 24 us per call hot, ~3x that when Redis wakes for each
call); only TURN_START's rare publishing path (a new, resumed or last turn) still decodes.

Keys are passed in ``KEYS`` (built by :mod:`tenure.service.state.keys`); the one exception is the
session key on the hot path when the session is inferred, which the script completes from a
key prefix the caller built, because the id is only known inside the script.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "APPLY",
    "INFERENCE_KEYS_PER_SESSION",
    "ROLLBACK",
    "TURN_START",
    "UNDO_SEPARATOR",
    "ApplyStatus",
    "RollbackStatus",
]


class ApplyStatus(IntEnum):
    """What :data:`APPLY` returns first (its reply is ``{status, seq}``)."""

    APPLIED = 1
    GUARD_FAILED = 0  # the guard field had another value: nothing changed
    MISSING = -1  # no such session (an update, not a create)
    EXISTS = -2  # a create found the session already there


class RollbackStatus(IntEnum):
    """What :data:`ROLLBACK` returns first (its reply is ``{status, seq}``)."""

    TAKEN_BACK = 1
    NOT_CURRENT = 0  # another turn started meanwhile: the failed one stays counted
    MISSING = -1


#: Prefix-hash keys kept per inferred session (its newest requests): the next turn finds the
#: newest, a retried or forked turn one of the few before it. Older ones are deleted, so Redis
#: holds a bounded number per session instead of one per inferred turn.
INFERENCE_KEYS_PER_SESSION = 4
#: Separates the fields of a record's ``undo`` entry (never in ids, numbers or JSON text).
UNDO_SEPARATOR = "\x1f"

# Shared tail: publish one decision. ``body`` is the decision's JSON with ``seq`` left out:
# ``head`` ends just before the value, ``tail`` starts just after it.
_PUBLISH = """
local function publish(head, tail, scoped, k_seq, k_stream, k_table, k_gc, maxlen, gc_at, now)
  local seq = redis.call('INCR', k_seq)
  local body = head .. seq .. tail
  redis.call('XADD', k_stream, 'MAXLEN', '~', maxlen, '*', 'seq', seq, 'd', body)
  redis.call('HSET', k_table, scoped, body)
  redis.call('ZADD', k_gc, gc_at, scoped)
  -- Sweeping expired table entries every 32nd decision bounds the table just as well.
  if seq % 32 == 0 then
    local dead = redis.call('ZRANGEBYSCORE', k_gc, '-inf', now, 'LIMIT', 0, 256)
    if #dead > 0 then
      redis.call('HDEL', k_table, unpack(dead))
      redis.call('ZREM', k_gc, unpack(dead))
    end
  end
  return seq
end

local function split_seq(json)
  local at = string.find(json, '"seq":0', 1, true)
  return string.sub(json, 1, at + 5), string.sub(json, at + 7)
end
"""

#: KEYS: 1 live index, 2 dseq, 3 decisions stream, 4 decision table, 5 table gc, 6 gap
#:       observations, 7 waits, 8.. prefix-hash keys (own full hash first, then shorter
#:       prefixes newest first; empty list when the session is explicit)
#: ARGV: 1 now, 2 explicit session id or '', 3 session key prefix, 4 id for a new inferred
#:       session, 5 scoped-id prefix ("tenant/"), 6 segment or '', 7 parent or '',
#:       8 last_turn '1'/'0', 9 session ttl s, 10 stream maxlen, 11 list maxlen,
#:       12 decision JSON (seq/turn/session filled here)
#: Returns: {session id, turn, previous state, gap observation entry or '', seq, inferred 0/1}
#: (an observation entry is 'stop_reason|tool|gap_s|expected_s', as in the gap log)
#:
#: The record's ``undo`` field keeps what this turn changed (fields joined by
#: UNDO_SEPARATOR: turn, previous state, last_activity, last_turn, suspended_at, wakeup_at,
#: host_ttl_s, live score, remaining ttl ms, 'g'/'w'/'' for the list an observation went to,
#: that entry, '1' if a decision was published, the session's previous decision JSON), so
#: ROLLBACK can take back a turn the upstream refused.
TURN_START = (
    _PUBLISH
    + """
local now = tonumber(ARGV[1])
local sid = ARGV[2]
local inferred = 0
if sid == '' then
  inferred = 1
  for i = 8, #KEYS do
    local found = redis.call('GET', KEYS[i])
    if found then sid = found; break end
  end
  if sid == '' then sid = ARGV[4] end
end
local skey = ARGV[3] .. sid
local ttl = tonumber(ARGV[9])
local listmax = tonumber(ARGV[11]) - 1
local prev = redis.call('HMGET', skey, 'state', 'turn', 'last_end', 'stop_reason', 'tool',
                        'expected_gap_s', 'suspended_at', 'parent', 'created_at', 'segments',
                        'version', 'wakeup_at', 'host_ttl_s', 'last_activity', 'last_turn', 'px')
local prev_state = prev[1] or ''
local turn = tonumber(prev[2] or '0') + 1
local observed = ''
local listed, entry = '', ''
if prev_state == 'idle' and prev[3] then
  local gap = now - tonumber(prev[3])
  if gap < 0 then gap = 0 end
  observed = (prev[4] or '') .. '|' .. (prev[5] or '') .. '|' .. string.format('%.6f', gap)
             .. '|' .. (prev[6] or '')
  redis.call('LPUSH', KEYS[6], observed)
  redis.call('LTRIM', KEYS[6], 0, listmax)
  listed, entry = 'g', observed
elseif prev_state == 'suspended' and prev[7] then
  local wait = now - tonumber(prev[7])
  if wait < 0 then wait = 0 end
  entry = string.format('%.6f', wait)
  redis.call('LPUSH', KEYS[7], entry)
  redis.call('LTRIM', KEYS[7], 0, listmax)
  listed = 'w'
end
local score = redis.call('ZSCORE', KEYS[1], sid)
local pttl = redis.call('PTTL', skey)
local fields = {'state', 'active', 'turn', turn, 'last_activity', ARGV[1],
                'last_turn', ARGV[8], 'id', sid, 'version', tonumber(prev[11] or '0') + 1}
if not prev[9] then
  table.insert(fields, 'created_at'); table.insert(fields, ARGV[1])
  table.insert(fields, 'inferred'); table.insert(fields, tostring(inferred))
end
local parent = prev[8]
if ARGV[7] ~= '' and not parent then
  parent = ARGV[7]
  table.insert(fields, 'parent'); table.insert(fields, parent)
end
local seg = ARGV[6]
if seg ~= '' then
  -- Segment ids are [A-Za-z0-9._:-]: their JSON form is the id in quotes, so a plain
  -- substring test is exact and the stored JSON list is extended without decoding it.
  local segs = prev[10]
  if not segs or segs == '[]' or segs == '{}' then
    table.insert(fields, 'segments'); table.insert(fields, '["' .. seg .. '"]')
  elseif not string.find(segs, '"' .. seg .. '"', 1, true) then
    local _, commas = string.gsub(segs, ',', '')
    if commas + 1 < 256 then
      table.insert(fields, 'segments')
      table.insert(fields, string.sub(segs, 1, -2) .. ',"' .. seg .. '"]')
    end
  end
end
if inferred == 1 and #KEYS >= 8 then
  -- Keep the newest few prefix keys of the session; delete the one that falls off.
  local kept = {}
  local px = prev[16] or ''
  for name in string.gmatch(px, '%S+') do
    if name ~= KEYS[8] then table.insert(kept, name) end
  end
  table.insert(kept, KEYS[8])
  while #kept > """
    + str(INFERENCE_KEYS_PER_SESSION)
    + """ do
    redis.call('DEL', table.remove(kept, 1))
  end
  table.insert(fields, 'px'); table.insert(fields, table.concat(kept, ' '))
end
-- The engine sees an arriving request itself, so "active" only needs publishing when it
-- changes what the adapter holds: a new session, or one leaving suspension (its host TTL
-- timer) or finish. A declared last turn is published when the turn ends, and only if the
-- upstream took the request.
local publishing = prev_state ~= 'idle' and prev_state ~= 'active'
local before = ''
if publishing then before = redis.call('HGET', KEYS[4], ARGV[5] .. sid) or '' end
local US = '\\31'
table.insert(fields, 'undo')
table.insert(fields, table.concat({turn, prev_state, prev[14] or '', prev[15] or '',
  prev[7] or '', prev[12] or '', prev[13] or '', score or '', pttl, listed, entry,
  publishing and '1' or '', before}, US))
redis.call('HSET', skey, unpack(fields))
if prev[7] or prev[12] or prev[13] then
  redis.call('HDEL', skey, 'suspended_at', 'wakeup_at', 'host_ttl_s')
end
redis.call('EXPIRE', skey, ttl)
redis.call('ZADD', KEYS[1], now, sid)
if inferred == 1 and #KEYS >= 8 then
  redis.call('SET', KEYS[8], sid, 'EX', ttl)
end
local seq = 0
if publishing then
  local d = cjson.decode(ARGV[12])
  d['session_id'] = ARGV[5] .. sid
  d['turn'] = turn
  if parent then d['parent'] = ARGV[5] .. parent end
  d['seq'] = 0
  local head, tail = split_seq(cjson.encode(d))
  seq = publish(head, tail, ARGV[5] .. sid, KEYS[2], KEYS[3], KEYS[4], KEYS[5],
                tonumber(ARGV[10]), now + ttl, now)
end
return {sid, turn, prev_state, observed, seq, inferred}
"""
)

#: KEYS: 1 session, 2 live index, 3 dseq, 4 decisions stream, 5 decision table, 6 table gc,
#:       7 a bounded list to push to (waits / suspensions) or the session key again if none
#: ARGV: 1 now, 2 guard field ('' none), 3 guard value ('' = the record must not exist),
#:       4 live score ('' = remove, '=' = keep), 5 ttl s, 6 scoped id, 7 decision JSON up to
#:       its seq value ('' = no decision), 8 decision JSON after its seq value, 9 stream
#:       maxlen, 10 session id, 11 value to push to KEYS[7] or '', 12 list maxlen, 13 must
#:       exist '1'/'0', 14 n = number of field/value strings, then n field/value strings,
#:       then the names of fields to delete
#: Returns: {status, seq} with status 1 applied, 0 guard failed, -1 missing, -2 exists
APPLY = (
    _PUBLISH
    + """
local now = tonumber(ARGV[1])
if ARGV[2] ~= '' and ARGV[3] ~= '' then
  -- A guarded write: the field's current value (nil for a missing record) must match.
  if redis.call('HGET', KEYS[1], ARGV[2]) ~= ARGV[3] then
    if ARGV[13] == '1' and redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
    return {0, 0}
  end
else
  local exists = redis.call('EXISTS', KEYS[1]) == 1
  if ARGV[3] == '' and ARGV[2] ~= '' then
    if exists then return {-2, 0} end
  elseif ARGV[13] == '1' and not exists then
    return {-1, 0}
  end
end
local n = tonumber(ARGV[14])
if n > 0 then redis.call('HSET', KEYS[1], unpack(ARGV, 15, 14 + n)) end
if #ARGV > 14 + n then redis.call('HDEL', KEYS[1], unpack(ARGV, 15 + n, #ARGV)) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
local ttl = tonumber(ARGV[5])
redis.call('EXPIRE', KEYS[1], ttl)
if ARGV[4] == '' then
  redis.call('ZREM', KEYS[2], ARGV[10])
elseif ARGV[4] == '=' then
  -- unchanged position in the live index
else
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[10])
end
if ARGV[11] ~= '' then
  redis.call('LPUSH', KEYS[7], ARGV[11])
  redis.call('LTRIM', KEYS[7], 0, tonumber(ARGV[12]) - 1)
end
local seq = 0
if ARGV[7] ~= '' then
  seq = publish(ARGV[7], ARGV[8], ARGV[6], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
                tonumber(ARGV[9]), now + ttl, now)
end
return {1, seq}
"""
)

#: KEYS: 1 session, 2 live index, 3 dseq, 4 decisions stream, 5 decision table, 6 table gc,
#:       7 gap observations, 8 waits
#: ARGV: 1 now, 2 the turn to take back, 3 session id, 4 scoped id, 5 stream maxlen,
#:       6 '1': delete a session born with this turn (one the sidecar named)
#: Returns: {status, seq}: 1 taken back, 0 not the session's current turn any more (another
#: turn started, or the turn already ended), -1 missing
#:
#: Puts back what TURN_START changed (its ``undo`` entry): the turn count, state, activity
#: and wake-up fields, the live-index score and expiry; drops the gap or wait sample the
#: turn added if it is still the newest; and, if the turn published "active", publishes the
#: session's previous decision again (a new session's entry is dropped from the table). A new
#: session stays known, as "idle" with no turns, unless ARGV[6] asks it gone.
ROLLBACK = (
    _PUBLISH
    + """
local now = tonumber(ARGV[1])
local cur = redis.call('HMGET', KEYS[1], 'turn', 'state', 'undo')
if not cur[1] then return {-1, 0} end
if cur[1] ~= ARGV[2] or cur[2] ~= 'active' or not cur[3] then return {0, 0} end
local u = {}
for part in string.gmatch(cur[3] .. '\\31', '([^\\31]*)\\31') do table.insert(u, part) end
if u[1] ~= ARGV[2] or #u < 12 then return {0, 0} end
local state = u[2]
if state == '' then state = 'idle' end
local fields = {'state', state, 'turn', tonumber(ARGV[2]) - 1,
                'last_turn', u[4] ~= '' and u[4] or '0'}
local gone = {'undo'}
local restore = {{'last_activity', 3}, {'suspended_at', 5}, {'wakeup_at', 6}, {'host_ttl_s', 7}}
for _, item in ipairs(restore) do
  local value = u[item[2]]
  if value ~= '' then
    table.insert(fields, item[1]); table.insert(fields, value)
  elseif item[1] ~= 'last_activity' then
    table.insert(gone, item[1])
  end
end
local pttl = tonumber(u[9])
if pttl == -2 and ARGV[6] == '1' then
  -- The record was born with this turn (PTTL -2: no key before it) under a name only the
  -- sidecar knows: taking the turn back takes the session back too, or every refused first
  -- turn would leave a record and an index entry behind for session_ttl_s.
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[3])
else
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('HDEL', KEYS[1], unpack(gone))
  redis.call('HINCRBY', KEYS[1], 'version', 1)
  if u[8] ~= '' then
    redis.call('ZADD', KEYS[2], u[8], ARGV[3])
  elseif u[2] == 'finished' then
    redis.call('ZREM', KEYS[2], ARGV[3])
  end
  if pttl and pttl > 0 then redis.call('PEXPIRE', KEYS[1], pttl) end
end
local list = nil
if u[10] == 'g' then list = KEYS[7] elseif u[10] == 'w' then list = KEYS[8] end
if list and redis.call('LINDEX', list, 0) == u[11] then redis.call('LPOP', list) end
local seq = 0
if u[12] == '1' then
  local before = u[13] or ''
  local a, b = string.find(before, '"seq":%d+')
  if a then
    local gc_at = now + math.max(pttl or 0, 0) / 1000
    seq = publish(string.sub(before, 1, a + 5), string.sub(before, b + 1), ARGV[4], KEYS[3],
                  KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[5]), gc_at, now)
  else
    redis.call('HDEL', KEYS[5], ARGV[4])
    redis.call('ZREM', KEYS[6], ARGV[4])
  end
end
return {1, seq}
"""
)
