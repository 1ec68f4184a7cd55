-- Acquire, or re-enter, the write side of a read/write lock; queue or unqueue the caller as a
-- waiting writer in the same step.
-- KEYS[1]  writer hash: owner -> count, ':t' -> token, ':i' -> holder info, ':r' -> readers wait,
--          ':l' -> every lease this hold was given, in all (ms): its age is ':l' - PTTL
-- KEYS[2]  readers: sorted set, '<owner>#<token>' -> lease deadline (server ms)
-- KEYS[3]  waiting writers: sorted set, owner -> entry deadline (server ms)
-- KEYS[4]  fence: last token granted for this name
-- KEYS[5]  readers' wake-up channel (used in modes 'x' and 'l' only)
-- KEYS[6..12]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- KEYS[13..15]  optional: the hash, the registry of waiting processes of the lock (DistLock,
--          DistRLock, DistCondition) of the same name, and this lock's writers' wake-up
--          channel: while that lock is held (or kept), a try is refused as if a writer held
--          it, and a queued writer's registers the writers' channel with it (rw_enlist)
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  fence TTL, ms: the lease plus the fence retention (see next_token); a re-entry
--          that extends the hold extends the counter to at least this (lengthen_hold)
-- ARGV[4]  holder info (host:pid)
-- ARGV[5]  mode: absent or '' try once, never queue; 'q' first try of a wait: queue if refused;
--          'w' later try of a wait: queue (refresh the entry) if refused, leave the queue if
--          granted; 'x' last try of a wait: leave the queue either way; 'l' no try: leave the
--          queue only (a wait interrupted or cancelled); otherwise the token of the hold the
--          caller believes it has (re-entry)
-- ARGV[6]  modes 'q' and 'w': the queue entry's lease, ms (ignored otherwise)
-- ARGV[7]  count to add; absent means 1 (the saved count for _acquire_restore())
-- return   token (> 0) when granted or re-entered; 0 after 'l';
--          0 when the re-entered hold is gone or is someone else's (the caller's lease is lost);
--          -(bound + 1) (<= -1) when refused: another writer holds it (bound = its PTTL) or
--          readers do (bound = ms until the earliest live reader's lease runs out), or the
--          lock of the same name is held (bound = its PTTL).
-- A writer that leaves the queue as the last live waiting writer wakes the readers.
--@ uses next_token lengthen_hold held_reply wrong_kind now_ms rw_enlist
local owner, lease, mode, count = ARGV[1], tonumber(ARGV[2]), ARGV[5] or '', ARGV[7] or '1'

-- Leave the queue, as the last live waiting writer waking the readers refused behind it (as
-- a refused 'x' does below). Safe to send again: once out, it changes nothing.
local function leave_queue()
  if redis.call('zrem', KEYS[3], owner) == 1 and
      redis.call('zcount', KEYS[3], '(' .. string.format('%.0f', now_ms()), '+inf') == 0 then
    redis.call('del', KEYS[3])
    if redis.call('exists', KEYS[1]) == 0 then
      redis.call('publish', KEYS[5], '*')
    else
      redis.call('hset', KEYS[1], ':r', 1)  -- readers refused behind us: wake them later
    end
  end
end

if mode == 'l' then
  leave_queue()
  return 0
end
if mode ~= '' and mode ~= 'q' and mode ~= 'w' and mode ~= 'x' then
  local f = redis.call('hmget', KEYS[1], owner, ':t')
  if not f[1] or f[2] ~= mode then
    return 0
  end
  redis.call('hincrby', KEYS[1], owner, tonumber(count))
  local pttl = redis.call('pttl', KEYS[1])
  if pttl < lease then
    lengthen_hold(KEYS[1], KEYS[4], pttl, lease, ARGV[3])  -- as lock_acquire's re-entry
  end
  return tonumber(mode)
end

local wrong = wrong_kind('W', 'SEB', 6)  -- a name is one lock
if wrong then
  if mode == 'x' then
    leave_queue()  -- a last try leaves the queue whatever its answer
  end
  return wrong
end
local now = nil
local function clock()
  if now == nil then
    local t = redis.call('time')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

local refused = nil
local locked = KEYS[13] and redis.call('pttl', KEYS[13]) or -2
if locked ~= -2 then
  -- the lock of this name is held: a name is one lock
  refused = held_reply(KEYS[13], locked)
  if mode == 'q' or mode == 'w' then
    rw_enlist(KEYS[13], KEYS[14], KEYS[15], locked, locked)
  end
elseif redis.call('exists', KEYS[1]) == 1 then
  refused = held_reply(KEYS[1])
else
  local last = redis.call('zrange', KEYS[2], -1, -1, 'withscores')
  if #last > 0 then
    if tonumber(last[2]) > clock() then
      local first = redis.call('zrangebyscore', KEYS[2], '(' .. string.format('%.0f', now), '+inf',
                               'withscores', 'limit', 0, 1)
      refused = -(math.max(1, tonumber(first[2]) - now) + 1)
    else
      -- no live reader: every one left ran out of lease (its process died)
      redis.call('del', KEYS[2])
    end
  end
end

if refused ~= nil then
  if mode == 'q' or mode == 'w' then
    local wait = tonumber(ARGV[6])
    redis.call('zadd', KEYS[3], string.format('%.0f', clock() + wait), owner)
    if redis.call('pttl', KEYS[3]) < wait then
      redis.call('pexpire', KEYS[3], wait)
    end
  elseif mode == 'x' then
    leave_queue()
  end
  return refused
end

local token = next_token(KEYS[4], ARGV[3])
if mode == 'w' or mode == 'x' then
  -- a writer that waited: readers may have been refused behind it, so its release wakes them
  redis.call('hset', KEYS[1], owner, count, ':t', string.format('%.0f', token), ':i', ARGV[4], ':r', 1,
             ':l', ARGV[2])
  redis.call('zrem', KEYS[3], owner)
else
  redis.call('hset', KEYS[1], owner, count, ':t', string.format('%.0f', token), ':i', ARGV[4],
             ':l', ARGV[2])
end
redis.call('pexpire', KEYS[1], lease)
return token
