-- Release some or all of a read hold; the last live reader out wakes a waiting writer.
-- KEYS[1]  readers: sorted set, '<owner>#<token>' -> lease deadline (server ms)
-- KEYS[2]  waiting writers (sorted set)
-- KEYS[3]  writers' wake-up channel
-- KEYS[4]  optional: the registry of waiting processes of the lock of the same name (see
--          lock_acquire): the last live reader out wakes one of them too (a name is one lock)
-- ARGV[1]  the hold's member, '<owner>#<token>'
-- ARGV[2]  the depth the caller keeps after this release; absent (or '0') ends the hold
-- return   that depth (0 when the hold is over);
--          -1 when the hold is gone or its lease ran out (the caller's lease is lost; an
--          expired member is removed).
--@ uses wake_one
local deadline = redis.call('zscore', KEYS[1], ARGV[1])
if not deadline then
  return -1
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left = tonumber(ARGV[2] or '0')
if tonumber(deadline) <= now then
  redis.call('zrem', KEYS[1], ARGV[1])
  return -1
elseif left > 0 then
  return left
end
redis.call('zrem', KEYS[1], ARGV[1])
-- Expired readers left behind (dead processes) need no hint: a waiting writer's sleep is
-- bounded by the earliest reader deadline, and its next try removes them.
local waited = redis.call('exists', KEYS[2], KEYS[4] or KEYS[2])
if waited > 0 and redis.call('zcount', KEYS[1], '(' .. string.format('%.0f', now), '+inf') == 0 then
  if redis.call('exists', KEYS[2]) == 1 then
    redis.call('publish', KEYS[3], '1')
  end
  if KEYS[4] and redis.call('exists', KEYS[4]) == 1 then
    wake_one(KEYS[4])
  end
end
return 0
