-- Release some or all of a fair lock's hold. The last release hands the lock straight to the
-- first live queued waiter (see _fair.lua); with nobody queued it frees it and, when the hold
-- was flagged as waited on (':w'), wakes a process of the plain registry, as lock_release does.
-- KEYS[1]  lock hash
-- KEYS[2]  fence
-- KEYS[3]  fq (see fair_acquire)
-- KEYS[4]  fd
-- KEYS[5]  fe
-- KEYS[6]  the plain registry of waiting processes (see lock_acquire)
-- ARGV[1]  owner id
-- ARGV[2]  token of the hold the caller believes it has
-- ARGV[3]  count to release: '1', or '0' for all of it (_release_save())
-- ARGV[4]  fence retention, ms
-- return   the count still held (0 when the hold ended);
--          -1 when the hold is gone or is someone else's (the caller's lease is lost).
--@ uses fair_pass_on
local fields = redis.call('hmget', KEYS[1], ARGV[1], ':t', ':w')
if not fields[1] or fields[2] ~= ARGV[2] then
  return -1
end
if fields[1] ~= '1' then
  local n = tonumber(ARGV[3])
  if n > 0 and n < tonumber(fields[1]) then
    local pttl = redis.call('pttl', KEYS[1])  -- a first write that needs no memory (lock_release)
    if pttl > 0 then
      redis.call('pexpire', KEYS[1], pttl)
    end
    return redis.call('hincrby', KEYS[1], ARGV[1], -n)
  end
end
fair_pass_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[4]), fields[3])
return 0
