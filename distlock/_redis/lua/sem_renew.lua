-- Renew the lease of one held permit (session watchdog), only while it is still held.
-- KEYS[1]  the semaphore (sorted set, see _sem.lua)
-- KEYS[2]  handed: sorted set of permits released on their owner's behalf
-- ARGV[1]  permit id
-- ARGV[2]  new lease, ms
-- return   1 when renewed;
--          2 when it was released on its owner's behalf (the owner forgets it; not a loss);
--          0 when it is gone: its lease ran out (never extended then; an expired member is
--          removed).
--@ uses fmt outlive sem_now
local deadline = redis.call('zscore', KEYS[1], ARGV[1])
if deadline == 'inf' then
  -- taken at rest: its deadline is the key's expiry (see _sem.lua), which is what to extend;
  -- PEXPIRE uses no memory, so this works out of memory too
  local pttl = redis.call('pttl', KEYS[1])
  if pttl >= 0 and pttl < tonumber(ARGV[2]) then
    redis.call('pexpire', KEYS[1], ARGV[2])
  end
  return 1
end
local NOW = sem_now()
if deadline and tonumber(deadline) > NOW then
  local renewed = math.max(tonumber(deadline), NOW + tonumber(ARGV[2]))
  -- The TTL first, ZADD after, so that a renewal works out of memory too (see outlive in
  -- _prelude.lua); no TTL at all while extra is not 0: it stays so.
  outlive(KEYS[1], renewed, NOW)
  redis.call('zadd', KEYS[1], fmt(renewed), ARGV[1])
  return 1
end
if deadline then
  redis.call('zrem', KEYS[1], ARGV[1])
end
if redis.call('zscore', KEYS[2], ARGV[1]) then
  return 2
end
return 0
