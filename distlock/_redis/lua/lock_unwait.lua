-- A process' last waiter for a lock gave up: take its channel off the registry, so that no
-- release wakes a process where nobody waits any more; and if the lock was being kept for it
-- (free_hold), free it and wake the next waiting process at once.
-- KEYS[1]  registry of waiting processes (see lock_acquire)
-- KEYS[2]  optional: the lock hash (see lock_acquire)
-- ARGV[1]  the process' wake-up channel for this lock
-- return   1 when it was registered, 0 otherwise.
--@ uses wake_one
local gone = redis.call('zrem', KEYS[1], ARGV[1])
if KEYS[2] then
  local h = redis.call('hmget', KEYS[2], ':t', ':r')
  if not h[1] and h[2] == ARGV[1] then
    redis.call('del', KEYS[2])
    wake_one(KEYS[1])
  end
end
return gone
