-- A process' last waiter for a lock gave up: take its channel off the registry, so that no
-- release wakes a process where nobody waits any more; and if the lock was being kept for it
-- (free_hold), free it and wake the next waiting process at once. When the lock is free and
-- others are registered, the next of them is woken as well, and the read/write lock's readers
-- that waited behind this process (lock_waited) are hinted on the way (wake_one).
-- KEYS[1]  registry of waiting processes (see lock_acquire)
-- KEYS[2]  optional: the lock hash (see lock_acquire)
-- ARGV[1]  the process' wake-up channel for this lock
-- return   1 when it was registered, 0 otherwise.
--@ uses wake_one
local gone = redis.call('zrem', KEYS[1], ARGV[1])
if KEYS[2] then
  redis.call('hdel', KEYS[2], ':h' .. ARGV[1])  -- its hand-off record (lock_acquire), if any
  local h = redis.call('hmget', KEYS[2], ':t', ':r')
  if not h[1] and h[2] == ARGV[1] then
    redis.call('del', KEYS[2])
    wake_one(KEYS[1])
  elseif gone == 1 and not h[1] and not h[2] and redis.call('exists', KEYS[1]) == 1 then
    -- the lock is free, and others are registered: readers of the read/write lock of this
    -- name that waited behind this process (lock_waited) are hinted, and the next process
    -- (it may have been refused by those readers' holds) tries again
    wake_one(KEYS[1])
  end
end
return gone
