-- Release some or all of an exclusive owner-counted hold. The last release frees the lock and,
-- when the hold was flagged as waited on (':w'), wakes the longest-registered waiting process
-- (free_hold), for which the lock is kept a moment when the caller yields (ARGV[4]).
-- KEYS[1]  lock hash
-- KEYS[2]  registry of waiting processes (see lock_acquire)
-- ARGV[1]  owner id
-- ARGV[2]  token of the hold the caller believes it has
-- ARGV[3]  count to release; absent means 1; '0' releases all of it (_release_save())
-- ARGV[4]  optional (distlock/_shares.py): 'k' while the caller's process is in its quantum
--          (wake nobody); 'y' when it yields (its quantum is over, or it never waited)
-- return   the count still held (0 when the lock is now free);
--          -1 when the hold is gone or is someone else's (the caller's lease is lost).
--@ uses free_hold
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
free_hold(KEYS[1], KEYS[2], fields[3], ARGV[4])
return 0
