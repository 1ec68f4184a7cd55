-- A process released a lock in its quantum without waking anyone (lock_release with 'k'), and
-- has not taken it again since: if the lock is still free, wake the longest-registered waiting
-- process now (distlock/_shares.py).
-- KEYS[1]  lock hash (see lock_acquire)
-- KEYS[2]  registry of waiting processes (see lock_acquire)
-- return   1 when a waiting process was told, 0 otherwise.
--@ uses wake_one
if redis.call('exists', KEYS[1]) == 1 then
  return 0  -- held again (its release wakes), or kept for a waiter (who was told)
end
return wake_one(KEYS[2])
