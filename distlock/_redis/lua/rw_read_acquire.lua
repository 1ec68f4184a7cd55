-- Acquire, or re-enter, the read side of a read/write lock.
-- KEYS[1]  writer hash: owner -> count, ':t' -> token, ':i' -> holder info, ':r' -> readers wait
-- KEYS[2]  readers: sorted set, '<owner>#<token>@<host:pid>' -> lease deadline (server ms)
-- KEYS[3]  waiting writers: sorted set, owner -> entry deadline (server ms)
-- KEYS[4]  fence: last token granted for this name
-- KEYS[5..11]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- KEYS[12..14]  optional: the hash, the registry of waiting processes of the lock (DistLock,
--          DistRLock, DistCondition) of the same name, and the readers' wake-up channel: while
--          that lock is held (or kept), or a process waits for it (lock_waited: a waiting
--          lock holder has a waiting writer's preference), a new read hold is refused, and
--          the readers' channel registered with it (rw_enlist), so that its release (or the
--          release after the waiting process' grant) wakes them
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  fence TTL, ms: the lease plus the fence retention (see next_token); a re-entry
--          that extends the hold extends the counter to at least this (outlive_fence)
-- ARGV[4]  absent (or '') for a new hold; for a re-entry, the token of the hold the caller
--          believes it has
-- ARGV[5]  the holder's 'host:pid', kept in its member for `distlock status` (absent, from
--          an older caller: the member is '<owner>#<token>')
-- return   token (> 0) when granted or re-entered (the reentrancy depth is the caller's to keep);
--          0 when the re-entered hold is gone or its lease ran out (the caller's lease is lost;
--          an expired member is removed);
--          -(bound + 1) (<= -1) when refused: a writer holds the lock (bound = its PTTL; the
--          writer's release will then wake the readers) or a writer is waiting (bound = ms
--          until the earliest live queue entry runs out), or the lock of the same name is
--          held (bound = its PTTL).
-- The readers' key always keeps a TTL at least as long as its latest deadline.
--@ uses next_token outlive_fence held_reply wrong_kind rw_enlist lock_waited
local owner, lease, reentry = ARGV[1], tonumber(ARGV[2]), ARGV[4] or ''
local info = (ARGV[5] and ARGV[5] ~= '') and ('@' .. ARGV[5]) or ''
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function keep(member, deadline)
  redis.call('zadd', KEYS[2], string.format('%.0f', deadline), member)
  if redis.call('pttl', KEYS[2]) < deadline - now then
    redis.call('pexpire', KEYS[2], deadline - now)
  end
end

if reentry ~= '' then
  local member = owner .. '#' .. reentry .. info
  local deadline = tonumber(redis.call('zscore', KEYS[2], member) or '0')
  if deadline <= now then
    redis.call('zrem', KEYS[2], member)
    return 0
  end
  keep(member, math.max(deadline, now + lease))
  if now + lease > deadline then
    outlive_fence(KEYS[4], ARGV[3])  -- the counter outlives the longer hold, as on a renewal
  end
  return tonumber(reentry)
end

local wrong = wrong_kind('W', 'SEB', 5)  -- a name is one lock
if wrong then
  return wrong
end
if KEYS[12] then
  local locked = redis.call('pttl', KEYS[12])
  if locked ~= -2 then
    -- the lock of this name is held: a name is one lock
    rw_enlist(KEYS[12], KEYS[13], KEYS[14], locked, locked)
    return held_reply(KEYS[12], locked)
  end
end
if redis.call('exists', KEYS[1]) == 1 then
  if redis.call('hexists', KEYS[1], owner) == 0 then
    redis.call('hset', KEYS[1], ':r', 1)
    return held_reply(KEYS[1])
  end
  -- the caller holds the write lock: a downgrade, never refused (nor queued behind writers)
else
  local first = redis.call('zrangebyscore', KEYS[3], '(' .. string.format('%.0f', now), '+inf',
                           'withscores', 'limit', 0, 1)
  if #first > 0 then
    return -(math.max(1, tonumber(first[2]) - now) + 1)
  end
  local waited = KEYS[13] and lock_waited(KEYS[13], now)
  if waited then
    -- a process waits for the lock of this name: readers queue behind it
    rw_enlist(KEYS[12], KEYS[13], KEYS[14], -2, waited)
    return -(waited + 1)
  end
end

local token = next_token(KEYS[4], ARGV[3])
keep(owner .. '#' .. string.format('%.0f', token) .. info, now + lease)
return token
