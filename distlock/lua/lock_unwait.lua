-- A process' last waiter for a lock gave up: take its channel off the registry, so that no
-- release wakes a process where nobody waits any more.
-- KEYS[1]  registry of waiting processes (see lock_acquire)
-- ARGV[1]  the process' wake-up channel for this lock
-- return   1 when it was registered, 0 otherwise.
return redis.call('zrem', KEYS[1], ARGV[1])
