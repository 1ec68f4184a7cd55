-- Release some or all of an exclusive owner-counted hold. The last release frees the lock and,
-- when the hold was flagged as waited on (':w'), wakes the longest-registered waiting process
-- (free_hold), to whose waiter the lock is handed, or for which it is kept a moment, when the
-- caller yields (ARGV[4]); or it hands the lock to a waiter of the caller's own process
-- (ARGV[5], below).
-- KEYS[1]  lock hash
-- KEYS[2]  registry of waiting processes (see lock_acquire)
-- KEYS[3]  optional: the fence. Given, a yield (ARGV[4] 'y') hands the lock straight to a
--          waiter of the next process that left a hand-off record (free_hold)
-- KEYS[4]  with ARGV[5] only: the fair queue's deadlines (_fair.lua)
-- ARGV[1]  owner id
-- ARGV[2]  token of the hold the caller believes it has
-- ARGV[3]  count to release; absent means 1; '0' releases all of it (_release_save())
-- ARGV[4]  optional (distlock/_core/shares.py): 'k' while the caller's process is in its
--          quantum (wake nobody); 'y' when it yields (its quantum is over, or it never
--          waited); '' for neither (wake the next process)
-- ARGV[5]  optional: the owner of a thread (or task) of the caller's process that waits for
--          this lock. When this release frees the lock and the lock would stay with this
--          process anyway (its quantum: ARGV[4] is 'k'; or no other live process is registered
--          as waiting), and no fair waiter queues, the lock is handed to that owner here, with
--          a new token: the in-process hand-off, woken in the process, with no second round
--          trip and no pub/sub
-- ARGV[6]  its lease, ms; ARGV[7] the fence TTL for it, ms (lease plus fence retention);
-- ARGV[8]  its holder info; ARGV[9] its count;
-- ARGV[10] the caller's process' wake-up channel for this lock (its registry entry);
-- ARGV[11] '1' when other waiters of the process remain (the entry stays), else '0'
-- return   the count still held (0 when the lock is now free);
--          -1 when the hold is gone or is someone else's (the caller's lease is lost);
--          -(token + 1) (<= -2) when the lock was handed to ARGV[5] with that token.
--@ uses free_hold next_token fmt now_ms
local fields = redis.call('hmget', KEYS[1], ARGV[1], ':t', ':w')
if not fields[1] or fields[2] ~= ARGV[2] then
  return -1
end
-- A hold one level deep is given back whole, whatever the count: no number to parse.
if fields[1] ~= '1' then
  local n = tonumber(ARGV[3] or '1')
  if n > 0 and n < tonumber(fields[1]) then
    -- Out of memory (maxmemory under noeviction), Redis refuses a script's first write when
    -- that command may use memory: HINCRBY may; PEXPIRE and DEL may not. Setting the TTL to
    -- what it is makes the HINCRBY a later write, which Redis allows, so giving back a level
    -- never fails for want of memory. (The `#!lua flags=allow-oom` shebang would say so
    -- directly, but needs Redis 7 and breaks fakeredis.)
    local pttl = redis.call('pttl', KEYS[1])
    if pttl > 0 then
      redis.call('pexpire', KEYS[1], pttl)
    end
    return redis.call('hincrby', KEYS[1], ARGV[1], -n)
  end
end
if ARGV[5] then
  local stays = ARGV[4] == 'k'
  local now
  if not stays then
    -- no other live process registered as waiting: only this one's own entry, if any
    now = now_ms()
    local others = redis.call('zcount', KEYS[2], now, '+inf')
    local own = redis.call('zscore', KEYS[2], ARGV[10])
    if own and tonumber(own) >= now then
      others = others - 1
    end
    stays = others == 0
  end
  if stays and redis.call('exists', KEYS[4]) == 1 then
    stays = redis.call('zcount', KEYS[4], now or now_ms(), '+inf') == 0
  end
  if stays then
    local token = next_token(KEYS[3], ARGV[7])
    redis.call('del', KEYS[1])
    if fields[3] then
      redis.call('hset', KEYS[1], ARGV[5], ARGV[9], ':t', fmt(token), ':i', ARGV[8],
                 ':l', ARGV[6], ':w', '1')
    else
      redis.call('hset', KEYS[1], ARGV[5], ARGV[9], ':t', fmt(token), ':i', ARGV[8],
                 ':l', ARGV[6])
    end
    redis.call('pexpire', KEYS[1], ARGV[6])
    if ARGV[11] ~= '1' then
      redis.call('zrem', KEYS[2], ARGV[10])
    end
    return -1 - token
  end
end
free_hold(KEYS[1], KEYS[2], fields[3], ARGV[4], KEYS[3])
return 0
