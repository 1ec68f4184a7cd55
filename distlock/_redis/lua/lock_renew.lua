-- Renew the lease of an exclusive hold, only if it is still the caller's.
-- KEYS[1]  lock hash (':l': every lease the hold was given, in all; see lock_acquire)
-- KEYS[2]  fence: the name's token counter, which must outlive the hold (see next_token)
-- ARGV[1]  owner id
-- ARGV[2]  token of the hold the caller believes it has
-- ARGV[3]  new lease, ms
-- ARGV[4]  fence TTL, ms: the new lease plus the fence retention
-- return   1 when renewed; 0 when the hold is gone or is someone else's (never extended then).
--@ uses outlive_fence
if redis.call('hget', KEYS[1], ':t') ~= ARGV[2] or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return 0
end
-- PEXPIRE before HINCRBY: out of memory, Redis refuses only a script's first write that may use
-- memory (see outlive in _prelude.lua), so the renewal itself never fails for want of memory.
local left = redis.call('pttl', KEYS[1])
local lease = tonumber(ARGV[3])
redis.call('pexpire', KEYS[1], lease)
if left >= 0 then
  redis.call('hincrby', KEYS[1], ':l', lease - left)  -- the hold's age stays ':l' - PTTL
end
outlive_fence(KEYS[2], ARGV[4])
return 1
