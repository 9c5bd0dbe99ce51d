"""The Lua scripts of the Redis store: every per-task operation that reads and then writes is one script.

Each script touches only one task's keys (its hash and its stream, which share a `{t:<id>}` hash tag) or
one owner's keys (`{o:<owner>}`), so it runs on Redis Cluster as on a single server. Errors come back as
error replies whose first word the store maps to an exception (`LOG_SEALED`, `LOG_DELETED`, `FENCED`,
`TASK_GONE`).

The task hash holds the record (`rec`: the immutable fields as JSON; `owner`, `status`, `msg`, `updated`,
`summary`, `outcome`, `rseq`, `due`, `until`, `epoch`), its owner lease (`replica`: the owning replica's
id, `lease`: the lease's expiry in Redis server time, ms; `cancel`: '1' once a cancel is requested) and
the log's state (`log`, `next_seq`, `sealed`,
`deleted`, `last_t`). Stream entry ids are `0-(seq+1)` (`0-0` is not a valid id), with fields `t` (the
append time) and `d` (the body). Optional values travel as `+value`, or `-` for none.
"""

from __future__ import annotations

__all__ = [
    "ADVANCE_NEXT_SEQ",
    "APPEND",
    "BOUNDS",
    "BUMP_EPOCH",
    "CLAIM_LEASE",
    "CREATE_LOG",
    "CREATE_RECORD",
    "DELETE_LOG",
    "DROP_RECORD",
    "INDEX_OWNED",
    "READ",
    "RECORD_FIELDS",
    "RENEW_LEASE",
    "REPLACE_OUTCOME",
    "REQUEST",
    "SEAL",
    "TAKE_INPUT",
    "UPDATE_STATUS",
]

RECORD_FIELDS = ("rec", "status", "msg", "updated", "summary", "rseq", "next_seq", "until")
"""What a record is built from, in the order the scripts return them."""

_RECORD_FIELD_NAMES = "{" + ", ".join(f"'{name}'" for name in RECORD_FIELDS) + "}"

_COMMON = f"""
local RECORD_FIELDS = {_RECORD_FIELD_NAMES}
local TERMINAL = {{completed = true, failed = true, cancelled = true}}

local function optional(hash, field, value)
  if string.sub(value, 1, 1) == '+' then
    redis.call('HSET', hash, field, string.sub(value, 2))
  else
    redis.call('HDEL', hash, field)
  end
end

-- Redis server time in ms: the one clock every replica's leases are measured by.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function record_of(hash)
  return redis.call('HMGET', hash, unpack(RECORD_FIELDS))
end

local function seq_of(id)
  return tonumber(string.sub(id, 3)) - 1
end

-- Age retention: drop the head entries older than `cutoff` (their `t` fields are non-decreasing, so
-- the walk stops at the first young one).
local function trim_aged(stream, cutoff)
  if cutoff == '' then return end
  local limit = tonumber(cutoff)
  while true do
    local head = redis.call('XRANGE', stream, '-', '+', 'COUNT', 64)
    if #head == 0 then break end
    local keep = nil
    for _, entry in ipairs(head) do
      if tonumber(entry[2][2]) >= limit then keep = entry[1]; break end
    end
    if keep then
      redis.call('XTRIM', stream, 'MINID', keep)
      break
    end
    redis.call('XTRIM', stream, 'MINID', '0-' .. (seq_of(head[#head][1]) + 2))
    if #head < 64 then break end
  end
end

-- Retention where the log is read: the age trim, then the earliest retained seq, computed from the
-- data: the first entry, but never more than `max_events` behind next_seq (`MAXLEN ~` keeps a few more
-- than asked; they are invisible).
local function retained_from(stream, next_seq, max_events, cutoff)
  trim_aged(stream, cutoff)
  local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
  if #first == 0 then return nil end
  local earliest = math.max(seq_of(first[1][1]), next_seq - max_events)
  if earliest >= next_seq then return nil end
  return earliest
end

local function ensure_log(hash)
  if redis.call('HGET', hash, 'log') ~= '1' then
    redis.call('HSET', hash, 'log', '1', 'next_seq', '0', 'sealed', '0', 'deleted', '0')
  end
end
"""

CREATE_RECORD = (
    _COMMON
    + """
-- KEYS: task hash. ARGV: rec, owner, status, msg, updated, summary, rseq, due, replica, lease ttl ms.
-- The lease's expiry (ms, server time), or 0 if the task exists.
local hash = KEYS[1]
if redis.call('HEXISTS', hash, 'owner') == 1 then return 0 end
local lease = now_ms() + tonumber(ARGV[10])
redis.call('HSET', hash, 'rec', ARGV[1], 'owner', ARGV[2], 'status', ARGV[3], 'updated', ARGV[5],
  'rseq', ARGV[7], 'due', ARGV[8], 'epoch', '0', 'replica', ARGV[9], 'lease', lease)
optional(hash, 'msg', ARGV[4])
optional(hash, 'summary', ARGV[6])
redis.call('HDEL', hash, 'outcome', 'replaced', 'until', 'cancel')
return lease
"""
)

INDEX_OWNED = """
-- KEYS: owner index (sorted set), owner counter. ARGV: task id. The score is the creation number.
local number = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], number, ARGV[1])
return number
"""

UPDATE_STATUS = (
    _COMMON
    + """
-- KEYS: task hash, stream. ARGV: expected, status, msg, updated, summary, outcome, retention ms ('' none),
-- until (wall-clock seconds the record lives until once terminal), sweep grace ms, the writer's epoch
-- ('-' for an unfenced writer: FENCED if it is not the task's).
local hash, stream = KEYS[1], KEYS[2]
if ARGV[10] ~= '-' and redis.call('HGET', hash, 'epoch') ~= ARGV[10] then
  return redis.error_reply('FENCED epoch ' .. ARGV[10] .. ' is stale')
end
local current = redis.call('HGET', hash, 'status')
if not current or current ~= ARGV[1] or TERMINAL[current] then return false end
redis.call('HSET', hash, 'status', ARGV[2], 'updated', ARGV[4])
optional(hash, 'msg', ARGV[3])
if TERMINAL[ARGV[2]] then
  optional(hash, 'summary', ARGV[5])
  if ARGV[6] ~= '-' then optional(hash, 'outcome', ARGV[6]) end
  if ARGV[7] ~= '' then
    -- Terminal retention: the hash and the stream expire together (a sweeping replica gets the grace
    -- to hand the record to its registry first).
    redis.call('HSET', hash, 'until', ARGV[8])
    local ms = tonumber(ARGV[7]) + tonumber(ARGV[9])
    for _, key in ipairs({hash, stream}) do
      local left = redis.call('PTTL', key)
      if left == -1 or left > ms then redis.call('PEXPIRE', key, ms) end
    end
  end
end
return record_of(hash)
"""
)

REPLACE_OUTCOME = (
    _COMMON
    + """
-- KEYS: task hash. ARGV: outcome. `replaced` marks it as no longer the task's own (an eviction's error).
if not TERMINAL[redis.call('HGET', KEYS[1], 'status') or ''] then return 0 end
redis.call('HSET', KEYS[1], 'outcome', ARGV[1], 'replaced', '1')
return 1
"""
)

ADVANCE_NEXT_SEQ = """
-- KEYS: task hash. ARGV: next_seq.
local known = redis.call('HGET', KEYS[1], 'rseq')
if known and tonumber(known) < tonumber(ARGV[1]) then redis.call('HSET', KEYS[1], 'rseq', ARGV[1]) end
return 0
"""

DROP_RECORD = (
    _COMMON
    + """
-- KEYS: task hash. ARGV: now. The record if it is due (its `due`, or its terminal `until`), dropped with
-- its outcome; the log's fields stay (a tombstone keeps next_seq), or the whole hash goes if it has none.
local hash = KEYS[1]
local now = tonumber(ARGV[1])
local fields = redis.call('HMGET', hash, 'owner', 'due', 'until')
if not fields[1] then return false end
local due = tonumber(fields[2])
if fields[3] and tonumber(fields[3]) < due then due = tonumber(fields[3]) end
if due > now then return false end
local dropped = record_of(hash)
table.insert(dropped, 1, fields[1])
redis.call('HDEL', hash, 'rec', 'owner', 'status', 'msg', 'updated', 'summary', 'outcome', 'replaced', 'rseq',
  'due', 'until', 'epoch', 'replica', 'lease', 'cancel')
if redis.call('HGET', hash, 'log') ~= '1' then redis.call('DEL', hash) end
return dropped
"""
)

BUMP_EPOCH = """
-- KEYS: task hash. ARGV: expected epoch. Compare-and-set epoch + 1 on a live record; the new epoch or false.
local current = redis.call('HGET', KEYS[1], 'epoch')
if not current or redis.call('HEXISTS', KEYS[1], 'owner') == 0 or current ~= ARGV[1] then return false end
return redis.call('HINCRBY', KEYS[1], 'epoch', 1)
"""

RENEW_LEASE = (
    _COMMON
    + """
-- KEYS: task hash, input list. ARGV: replica, epoch, lease ttl ms. Compare-and-set on (replica, epoch):
-- {1, lease expiry, cancel requested 0/1, input answers waiting 0/1} while the replica holds the task
-- unfinished; {2} if it holds it ended (its status update just landed: nothing to renew); {0} once it
-- does not hold it (taken over, or the record expired).
local hash = KEYS[1]
local fields = redis.call('HMGET', hash, 'replica', 'epoch', 'status', 'cancel')
if fields[1] ~= ARGV[1] or fields[2] ~= ARGV[2] or not fields[3] then return {0} end
if TERMINAL[fields[3]] then return {2} end
local lease = now_ms() + tonumber(ARGV[3])
redis.call('HSET', hash, 'lease', lease)
local waiting = 0
if redis.call('LLEN', KEYS[2]) > 0 then waiting = 1 end
return {1, lease, fields[4] == '1' and 1 or 0, waiting}
"""
)

CLAIM_LEASE = (
    _COMMON
    + """
-- KEYS: task hash. ARGV: replica, lease ttl ms. Take over an unfinished task whose lease has expired:
-- epoch + 1 (the former owner is fenced from then on), this replica, a fresh lease.
-- {1, new epoch, lease, cancel requested 0/1}; {0, lease}: the lease is live (someone renewed it or
-- claimed it first); {-1}: nothing to claim (ended, or no record).
local hash = KEYS[1]
local fields = redis.call('HMGET', hash, 'owner', 'status', 'lease', 'cancel')
if not fields[1] or not fields[2] or TERMINAL[fields[2]] then return {-1} end
local now = now_ms()
local lease = tonumber(fields[3] or '0')
if lease > now then return {0, lease} end
local epoch = redis.call('HINCRBY', hash, 'epoch', 1)
lease = now + tonumber(ARGV[2])
redis.call('HSET', hash, 'replica', ARGV[1], 'lease', lease)
return {1, epoch, lease, fields[4] == '1' and 1 or 0}
"""
)

REQUEST = (
    _COMMON
    + """
-- KEYS: task hash, input list. ARGV: 'cancel' or 'input', the answers (JSON, for 'input'), the
-- replicas' control channel prefix, the task id. Record a request for the replica that runs the unfinished task and
-- tell it on its control channel; 1, or 0 if the task has ended or has no record.
local hash = KEYS[1]
local fields = redis.call('HMGET', hash, 'owner', 'status', 'replica')
if not fields[1] or not fields[2] or TERMINAL[fields[2]] then return 0 end
if ARGV[1] == 'cancel' then
  redis.call('HSET', hash, 'cancel', '1')
else
  redis.call('RPUSH', KEYS[2], ARGV[2])
  local left = redis.call('PTTL', hash)
  if left > 0 then redis.call('PEXPIRE', KEYS[2], left) end
end
if fields[3] then redis.call('PUBLISH', ARGV[3] .. fields[3], ARGV[4]) end
return 1
"""
)

TAKE_INPUT = """
-- KEYS: input list. The answers waiting for the owner (JSON each), oldest first; the list is emptied.
local answers = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return answers
"""

APPEND = (
    _COMMON
    + """
-- KEYS: task hash, stream, acks. ARGV: the header, then the bodies. The header is one string (one
-- argument packs faster than seven): "now max_events cutoff seal+epilogue epoch batch token", with
-- cutoff and epoch '-' for none (no age limit; an unfenced writer), seal+epilogue two digits 0/1.
-- The seq of the first body.
local hash, stream, acks = KEYS[1], KEYS[2], KEYS[3]
local head = {}
for word in string.gmatch(ARGV[1], '%S+') do head[#head + 1] = word end
local now, max_events, cutoff, flags, epoch, batch, token = unpack(head)
max_events = tonumber(max_events)
if cutoff == '-' then cutoff = '' end
if epoch == '-' then epoch = '' end
local seal, epilogue = string.sub(flags, 1, 1) == '1', string.sub(flags, 2, 2) == '1'
local channel = string.sub(hash, 1, -3) .. ':w'
-- A pipeline retried after a lost connection replays its appends: the ones that already ran answer
-- what they answered then instead of appending twice. The acks string holds the last batch's answers,
-- "batch token=first token=first ...", one GET and one SET per append.
local acked = redis.call('GET', acks)
if acked and string.match(acked, '^%S+') == batch then
  local done = string.match(acked, ' ' .. token .. '=(%d+)')
  if done then return tonumber(done) end
else
  acked = batch
end
local state = redis.call('HMGET', hash, 'log', 'next_seq', 'sealed', 'deleted', 'last_t', 'owner', 'epoch')
if epoch ~= '' then
  -- A fenced writer: the task must still exist (not expired) and still be its to write.
  if not state[6] then return redis.error_reply('TASK_GONE the task is unknown or expired') end
  if state[7] ~= epoch then
    return redis.error_reply('FENCED epoch ' .. epoch .. ' is stale: the task is at ' .. tostring(state[7]))
  end
end
if state[4] == '1' then return redis.error_reply('LOG_DELETED the log is deleted') end
if state[3] == '1' and not epilogue then return redis.error_reply('LOG_SEALED the log is sealed') end
if state[1] ~= '1' then ensure_log(hash) end
local first = tonumber(state[2] or '0')
local count = #ARGV - 1
if count > 0 then
  local at = now
  local last = state[5]
  -- Never older than the last retained event, so age trimming can stop at the first young entry.
  if last and tonumber(last) > tonumber(now) and redis.call('XLEN', stream) > 0 then at = last end
  for i = 1, count do
    redis.call('XADD', stream, 'MAXLEN', '~', max_events, '0-' .. (first + i), 't', at, 'd', ARGV[1 + i])
  end
  redis.call('HSET', hash, 'next_seq', first + count, 'last_t', at)
  local left = redis.call('PTTL', hash)
  if left > 0 and redis.call('PTTL', stream) == -1 then redis.call('PEXPIRE', stream, left) end
  trim_aged(stream, cutoff)
end
if seal then redis.call('HSET', hash, 'sealed', '1') end
if count > 0 or seal then redis.call('PUBLISH', channel, first + count) end
redis.call('SET', acks, acked .. ' ' .. token .. '=' .. first, 'PX', 60000)
return first
"""
)

CREATE_LOG = (
    _COMMON
    + """
-- KEYS: task hash.
ensure_log(KEYS[1])
return 0
"""
)

SEAL = (
    _COMMON
    + """
-- KEYS: task hash. ARGV: channel.
ensure_log(KEYS[1])
if redis.call('HGET', KEYS[1], 'sealed') ~= '1' then
  redis.call('HSET', KEYS[1], 'sealed', '1')
  redis.call('PUBLISH', ARGV[1], 'sealed')
end
return 0
"""
)

BOUNDS = (
    _COMMON
    + """
-- KEYS: task hash, stream. ARGV: max_events, cutoff. {next_seq, sealed, earliest or -1}, or false: no log.
local state = redis.call('HMGET', KEYS[1], 'log', 'next_seq', 'sealed')
if state[1] ~= '1' then return false end
local next_seq = tonumber(state[2])
local earliest = retained_from(KEYS[2], next_seq, tonumber(ARGV[1]), ARGV[2]) or -1
return {next_seq, tonumber(state[3]), earliest}
"""
)

READ = (
    _COMMON
    + """
-- KEYS: task hash, stream. ARGV: max_events, cutoff, after, limit. Flat {id, t, body, ...} from the
-- first retained seq after `after`.
local next_seq = tonumber(redis.call('HGET', KEYS[1], 'next_seq') or '-1')
if next_seq < 0 then return {} end
local earliest = retained_from(KEYS[2], next_seq, tonumber(ARGV[1]), ARGV[2])
if not earliest then return {} end
local start = math.max(tonumber(ARGV[3]) + 1, earliest)
local out = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[2], '0-' .. (start + 1), '+', 'COUNT', ARGV[4])) do
  out[#out + 1] = entry[1]
  out[#out + 1] = entry[2][2]
  out[#out + 1] = entry[2][4]
end
return out
"""
)

DELETE_LOG = """
-- KEYS: task hash, stream. ARGV: tombstone ms, channel. Drop the events; the hash keeps next_seq, sealed
-- and deleted for at least the tombstone's life.
local hash = KEYS[1]
if redis.call('HGET', hash, 'log') ~= '1' or redis.call('HGET', hash, 'deleted') == '1' then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', hash, 'deleted', '1', 'sealed', '1')
local left = redis.call('PTTL', hash)
if left == -1 or left < tonumber(ARGV[1]) then redis.call('PEXPIRE', hash, ARGV[1]) end
redis.call('PUBLISH', ARGV[2], 'deleted')
return 1
"""
