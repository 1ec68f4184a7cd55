-- Release some or all of a write hold; the last release frees the write side and wakes the
-- next waiting writer if there is one, else the waiting readers (when any were refused).
-- KEYS[1]  writer hash
-- KEYS[2]  waiting writers (sorted set, owner -> entry deadline in server ms)
-- KEYS[3]  writers' wake-up channel
-- KEYS[4]  readers' wake-up channel
-- KEYS[5]  optional: the registry of waiting processes of the lock of the same name (see
--          lock_acquire): the last release wakes one of them too (a name is one lock)
-- ARGV[1]  owner id
-- ARGV[2]  token of the hold the caller believes it has
-- ARGV[3]  count to release; absent means 1; '0' releases all of it (_release_save())
-- return   the count still held (0 when the write side is now free);
--          -1 when the hold is gone or is someone else's (the caller's lease is lost).
--@ uses wake_one
local f = redis.call('hmget', KEYS[1], ARGV[1], ':t', ':r')
local count = tonumber(f[1])
if count == nil or f[2] ~= ARGV[2] then
  return -1
end
local n = tonumber(ARGV[3] or '1')
if n > 0 and n < count then
  -- PEXPIRE (to the TTL it has) before HINCRBY: out of memory (maxmemory under noeviction),
  -- Redis refuses a script's first write when that command may use memory (HINCRBY may,
  -- PEXPIRE may not) and allows later ones, so giving back a level never fails for want of
  -- memory. See lock_release.lua.
  local pttl = redis.call('pttl', KEYS[1])
  if pttl > 0 then
    redis.call('pexpire', KEYS[1], pttl)
  end
  return redis.call('hincrby', KEYS[1], ARGV[1], -n)
end
redis.call('del', KEYS[1])
if KEYS[5] and redis.call('exists', KEYS[5]) == 1 then
  wake_one(KEYS[5])
end
if redis.call('exists', KEYS[2]) == 1 then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if redis.call('zcount', KEYS[2], '(' .. string.format('%.0f', now), '+inf') > 0 then
    redis.call('publish', KEYS[3], '1')
    return 0
  end
end
if f[3] then
  redis.call('publish', KEYS[4], '*')
end
return 0
