-- Renew the lease of a read hold, only if it is still there and its lease has not run out.
-- KEYS[1]  readers: sorted set, '<owner>#<token>' -> lease deadline (server ms)
-- KEYS[2]  fence: the name's token counter, which must outlive the hold (see next_token)
-- ARGV[1]  the hold's member, '<owner>#<token>'
-- ARGV[2]  new lease, ms
-- ARGV[3]  fence TTL, ms: the new lease plus the fence retention
-- return   1 when renewed; 0 when the hold is gone or its lease ran out: it is never extended
--          then (an expired member is removed).
--@ uses outlive_fence
local deadline = tonumber(redis.call('zscore', KEYS[1], ARGV[1]) or '0')
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if deadline <= now then
  redis.call('zrem', KEYS[1], ARGV[1])
  return 0
end
deadline = math.max(deadline, now + tonumber(ARGV[2]))
-- PEXPIRE before ZADD: out of memory (maxmemory under noeviction), Redis refuses a script's
-- first write when that command may use memory (ZADD may, PEXPIRE may not) and allows later
-- ones, so a renewal never fails for want of memory. The TTL only grows, to cover the deadline.
redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), deadline - now))
redis.call('zadd', KEYS[1], string.format('%.0f', deadline), ARGV[1])
outlive_fence(KEYS[2], ARGV[3])
return 1
